"""Probe results kept in an Optuna study on disk: one trial per probe, so a search resumes where it stopped.

OOM is not a failure: the trial completes with a positive constraint value (peak - budget), which is what
Optuna's constrained samplers read and optuna-dashboard draws as infeasible. Crashes and time-outs are FAIL trials.
A probe that was interrupted leaves a RUNNING trial without a result; it is not reused and runs again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union, cast

import optuna
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from autofit.core import Candidate, InputError, Outcome, ProbeResult, SearchSpec, format_size, installed_versions
from autofit.machine import UnknownModelError, atomic_write_text, driver_version, first_gpu, resolve_model

log = logging.getLogger(__name__)

STUDY_FILE = "study.journal"
OBJECTIVE = "tokens/s"  # each trial's value: measured throughput, 0 when the probe does not fit
CONSTRAINTS_ATTR = "constraints"  # the trial system attribute Optuna and optuna-dashboard read constraints from
CONSTRAINT_MEANING = "peak bytes minus the budget: above 0 is out of memory"
# Outcomes an earlier run's result is reused for. A crash or a time-out may have a cause that has been fixed since
# (or a longer --probe-timeout), so those probes run again.
REUSABLE = (Outcome.OK, Outcome.OOM, Outcome.INVALID)
Steps = Union[int, str]  # a probe's optimizer steps, or a verification's ("auto" or a count)
SIZES = ("micro_batch", "max_length")  # a probe's sizes: trial parameters where the question lets them vary
# The sizes in the question (``SearchSpec.question_key``): "...|max_length|min_length|effective_batch|maximize|..."
QUESTION_SIZES = re.compile(r"\|(\d+)\|(\d+)\|(\d+)\|(?:batch|length)\|")


def fixed_sizes(question: str) -> Dict[str, int]:
    """The probe sizes the question holds constant: ``max_length`` when its floor is the length itself (no shorter
    length is ever probed), ``micro_batch`` when the effective batch is 1. They are the study's attributes, not
    parameters of every trial: a constant parameter is credited with a share of the objective by optuna-dashboard's
    parameter importance. A question this cannot read fixes nothing (every size a parameter, as before)."""
    found = QUESTION_SIZES.search(question)
    if not found:
        return {}
    length, floor, effective = (int(group) for group in found.groups())
    fixed = {"max_length": length} if floor >= length else {}
    if effective == 1:
        fixed["micro_batch"] = 1
    return fixed


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """Hold Ctrl-C (and SIGTERM) until the block ends: an interrupt in the middle of a journal write would corrupt
    the study. A signal held is raised again once its own handler is back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: List[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for signum in dict.fromkeys(received):
        signal.raise_signal(signum)


def recover_journal(path: Path) -> bool:
    """Keep the journal's lines up to the first that is not a JSON record; the whole file goes to
    ``<name>.damaged``. True when something was cut, or a last line lacked its newline (a write cut short: Optuna
    skips such a line when it reads, then appends its next record to it, which no reader can parse)."""
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    valid = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            break
        if not isinstance(record, dict):
            break
        valid.append(line if line.endswith(b"\n") else line + b"\n")
    if len(valid) == len(lines) and data.endswith(b"\n"):
        return False
    os.replace(path, path.with_name(path.name + ".damaged"))
    atomic_write_text(path, b"".join(valid).decode("utf-8"))  # valid JSON lines are UTF-8
    return True


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's per-trial INFO lines are noise here (a probe line says more): WARNING while the block runs, the
    caller's verbosity restored after."""
    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(previous)


# What a probe's peak depends on beyond its candidate: libraries whose code allocates what is measured.
MEASURING_PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "deepspeed",
                      "flash-attn", "liger-kernel", "triton", "trl-autofit")  # autofit itself: its probes and meters
# The allocator's environment: each can change a peak (expandable segments, caching off, a per-process fraction).
ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
                       "PYTORCH_HIP_ALLOC_CONF")


def fingerprint(model_config: Dict[str, object], device: str, gpu: Optional[str] = None,
                driver: Optional[str] = None) -> str:
    """What a stored probe was measured on besides its candidate: the model's configuration (its content, not its
    name or path), the installed versions of the libraries that allocate (autofit's own, flash-attn, liger-kernel and
    triton included), the allocator's environment variables, the device and the GPU's driver. A stored result with
    another fingerprint is not reused."""
    data: Dict[str, object] = {"config": model_config, "versions": installed_versions(MEASURING_PACKAGES),
                               "device": device, "gpu": gpu}
    allocator = {name: os.environ[name] for name in ALLOCATOR_VARIABLES if name in os.environ}
    if allocator:
        data["allocator"] = allocator
    if driver:
        data["driver"] = driver
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def measured_on(spec: SearchSpec) -> str:
    """The fingerprint of a search's probes: its model's configuration as it is now, this machine's libraries and
    device."""
    try:
        config: Dict[str, object] = dict(resolve_model(spec.options.model).config)
    except UnknownModelError:  # a factory's own model: the study's name has the factory
        config = {"model": spec.options.model}
    gpu = first_gpu() if spec.device == "cuda" else None
    return fingerprint(config, spec.device, gpu.name if gpu else None,
                       driver_version() if spec.device == "cuda" else None)


class _NamedJournal(JournalFileBackend):
    """Optuna's journal file, whose write failures name it (a full disk, ``ulimit -f``, a quota: ``f.write`` raises
    an OSError without a file name, and the search's one line must say which file)."""

    def append_logs(self, logs: List[Dict[str, Any]]) -> None:
        try:
            super().append_logs(logs)
        except OSError as exc:
            if exc.filename is not None:
                raise
            raise OSError(exc.errno, exc.strerror, self._file_path) from exc


def _kind_of(path: Path) -> str:
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a link to nothing"
    for test, kind in ((stat.S_ISFIFO, "a fifo"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return kind
    return "not a regular file"


class ProbeStore:
    def __init__(self, out_dir: Path, study_name: str, budget_bytes: Optional[int], levels: int, max_batch: int,
                 max_length: int, fingerprint: str = "", question: str = ""):
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        self.notes: List[str] = []
        self.fingerprint = fingerprint
        self.study = self._open(Path(out_dir) / STUDY_FILE, study_name)
        self.fixed = fixed_sizes(question)
        self._label(question)
        self.budget_bytes = budget_bytes
        self.distributions: Dict[str, BaseDistribution] = {
            "level": IntDistribution(0, max(levels - 1, 0)),
            "micro_batch": IntDistribution(1, max(max_batch, 1)),
            "max_length": IntDistribution(1, max(max_length, 1)),
        }
        self._cache: Dict[Tuple[str, str, Steps], ProbeResult] = {}
        # probes this study has spent on this question, earlier runs' included: what --max-probes counts
        self.probes_spent = 0
        stale = 0
        for trial in self.study.get_trials(deepcopy=False):
            attrs = trial.user_attrs
            if "result" not in attrs:
                continue  # interrupted before it finished: it runs again
            if fingerprint and attrs.get("fingerprint") != fingerprint:
                stale += 1  # measured on another configuration of the model, other libraries or another device
                continue
            self.probes_spent += 1
            try:
                result = ProbeResult.from_dict(attrs["result"])
                key = (str(attrs["key"]), str(attrs["kind"]), cast(Steps, attrs.get("steps")))
            except (KeyError, TypeError, ValueError) as exc:  # a record this version cannot read: probe again
                log.warning("study record %d of %s is not readable (%s): its probe runs again", trial.number,
                            STUDY_FILE, exc)
                continue
            if result.outcome in REUSABLE:
                self._cache[key] = result
        if stale:
            self.notes.append(f"{stale} probe(s) stored in {Path(out_dir) / STUDY_FILE} were measured on another "
                              "configuration of the model, other library versions or another device: they are "
                              "measured again")
            log.warning("%s", self.notes[-1])
        self.probes_run = 0

    def _open(self, path: Path, study_name: str) -> optuna.Study:
        """The study in ``path``; a journal damaged after its valid records (a crash mid-write, a stray line) is cut
        back to them, the damaged file kept beside it. Anything but a file there (a fifo, a device, a folder) is
        refused before it is opened: opening a fifo to append waits for a reader forever."""
        if os.path.lexists(path) and not path.is_file():
            raise InputError(f"{path} is not a file ({_kind_of(path)}): the study's journal goes there; move it away "
                             "or give another --out")
        if path.is_file() and path.stat().st_size and recover_journal(path):  # before Optuna appends to it
            self.notes.append(f"{path} was damaged or cut short after its valid records (a full disk, a crash "
                              f"mid-write): they were kept and the whole file moved to {path.name}.damaged")
            log.warning("%s", self.notes[-1])
        for attempt in range(2):
            try:
                storage = JournalStorage(_NamedJournal(str(path)))
                return optuna.create_study(study_name=study_name, storage=storage, direction="maximize",
                                           load_if_exists=True)
            except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
                if attempt == 0 and recover_journal(path):
                    self.notes.append(f"{path} was damaged ({type(exc).__name__}: {exc}); its valid records were "
                                      f"kept and the damaged file moved to {path.name}.damaged")
                    log.warning("%s", self.notes[-1])
                    continue
                raise InputError(f"the study {path} cannot be read ({type(exc).__name__}: {exc}): move it away to "
                                 "start the search over") from None
        raise AssertionError("unreachable")

    def _label(self, question: str) -> None:
        """What optuna-dashboard shows beside the study's values: the objective's name and the whole question."""
        if self.study.metric_names is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                self.study.set_metric_names([OBJECTIVE])
        if question and self.study.user_attrs.get("question") != question:
            self.study.set_user_attr("question", question)
        if "constraint" not in self.study.user_attrs:
            self.study.set_user_attr("constraint", CONSTRAINT_MEANING)
        for name, value in self.fixed.items():  # the question's constants, once (a resumed study keeps its own)
            if name not in self.study.user_attrs:
                self.study.set_user_attr(name, value)

    @property
    def probes_total(self) -> int:
        """Probes recorded in the study, those of earlier (interrupted) runs included."""
        return len(self._cache)

    def lookup(self, candidate: Candidate, kind: str, steps: Steps) -> Optional[ProbeResult]:
        return self._cache.get((candidate.key(), kind, steps))

    def measure(
        self, candidate: Candidate, kind: str, steps: Steps, level: int, run: Callable[[], ProbeResult],
        fresh: bool = False,
    ) -> Tuple[ProbeResult, bool]:
        """The stored result for ``candidate`` measured over ``steps``, or run it as a new trial (always with
        ``fresh``). Returns (result, was_cached)."""
        cached = None if fresh else self.lookup(candidate, kind, steps)
        if cached is not None:
            return cached, True
        params = {"level": level}
        for size in SIZES:  # a size the question fixes is a study attribute; one that differs from it is a parameter
            value = getattr(candidate, size)
            if self.fixed.get(size) != value:
                params[size] = value
        with deferred_interrupt():
            self.study.enqueue_trial(params, user_attrs={"key": candidate.key(), "kind": kind, "steps": steps,
                                                         "fingerprint": self.fingerprint})
            trial = self.study.ask(fixed_distributions={name: self.distributions[name] for name in params})
            trial.set_user_attr("candidate", candidate.to_dict())
            trial.set_user_attr("config", candidate.describe())  # flat attributes: what optuna-dashboard lists
            trial.set_user_attr("rungs", "+".join(candidate.rungs) or "baseline")
        result = run()
        with deferred_interrupt():
            self._record(trial, result)
        self._cache[(candidate.key(), kind, steps)] = result
        self.probes_run += 1
        self.probes_spent += 1
        return result, False

    def _record(self, trial: optuna.trial.Trial, result: ProbeResult) -> None:
        trial.set_user_attr("result", result.to_dict())
        trial.set_user_attr("outcome", result.outcome.value)
        trial.set_user_attr("peak_bytes", int(result.peak_bytes or 0))
        trial.set_user_attr("phase_peaks", {phase: int(peak) for phase, peak in (result.phase_peaks or {}).items()})
        trial.set_user_attr("tokens_per_second", round(result.tokens_per_second or 0.0, 1))
        if self.budget_bytes is not None:
            over = result.peak_bytes - self.budget_bytes
            if result.outcome is Outcome.OOM:
                over = max(over, 1)
            # Optuna's first format, a list: optuna-dashboard (0.21) reads only that, and Optuna reads both.
            trial.storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_ATTR, [float(over)])
            if result.outcome in (Outcome.OK, Outcome.OOM):  # what the dashboard's trial list says of it (its tag
                # is the trial's state, Complete for both: an OOM is an infeasible trial, not a failed one)
                trial.set_user_attr("feasible", "yes" if result.outcome is Outcome.OK else
                                    f"no: out of memory at a peak of {format_size(result.peak_bytes)} (budget "
                                    f"{format_size(self.budget_bytes)})")
        if result.outcome in (Outcome.OK, Outcome.OOM):
            self.study.tell(trial, result.tokens_per_second if result.fits else 0.0)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
