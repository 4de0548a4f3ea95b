"""The probe worker: runs inside a fresh child process, never in the search's process.

It builds the trainer through the factory under a memory meter, trains a few optimizer steps on worst-case data,
and writes one JSON result. Any exception is classified by ``outcome.classify_exception``; the process then exits,
so nothing an out-of-memory error leaves behind can reach the next probe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, Optional

from autofit.core import (
    BAD_FORK,
    ENGINE_FAILURE,
    INFRASTRUCTURE,
    KERNEL_FAILURE,
    PHASE_FILE,
    USER,
    BuildTimeout,
    Candidate,
    FactoryMisuse,
    Outcome,
    ProbeResult,
    atomic_write_text,
    classify_exception,
    error_origin,
    exempt_phases,
    others_bytes,
    record_probe_process,
    user_file,
)
from autofit.probe import _activation_offload as activation_offload
from autofit.probe import _kernels as kernels
from autofit.probe import _simulated_fsdp as simulated_fsdp
from autofit.probe import _virtual_checkpoint as virtual_checkpoint
from autofit.probe import kit as probe_kit
from autofit.probe._factory import FactoryPayload
from autofit.probe._instrument import (
    PhaseFile,
    ProbeClock,
    instrument_rl_phases,
    models_of,
    phase_callback,
)
from autofit.probe._observe import describe_trainer
from autofit.rungs import FSDP_ENGINES

log = logging.getLogger(__name__)



def make_meter(candidate: Candidate, budget_bytes: Optional[int]):
    if exempt_phases(candidate):  # vLLM estimated: the budget is checked after the run, without its phases
        budget_bytes = None
    if candidate.device == "cpu":
        from autofit.probe._meters import SimulatedMeter

        return SimulatedMeter(budget_bytes, others=lambda: others_bytes("cpu"),
                              host_aware=bool(candidate.offload or candidate.activation_offload))
    from autofit.probe._meters import CudaMeter

    return CudaMeter(budget_bytes, device=int(os.environ.get("LOCAL_RANK", "0")),  # one GPU per rank
                     empty_after=exempt_phases(candidate))


def inherited_cuda() -> Optional[str]:
    """Why this probe cannot use CUDA because of the process it was forked from; None when it can.

    A process forked after CUDA was initialized cannot initialize it again ("bad fork"). The probe server records
    whether its preload initialized CUDA (``autofit.probe._preload``); torch itself marks a forked child of a process
    that had (``torch.cuda._is_in_bad_fork``). A spawned probe has neither."""
    preload = sys.modules.get("autofit.probe._preload")
    if preload is not None and getattr(preload, "cuda_initialized", False):
        return ("CUDA was initialized in the probe server before this probe was forked "
                f"(after importing {', '.join(getattr(preload, 'PRELOADED', ()))})")
    torch = sys.modules.get("torch")
    in_bad_fork = getattr(getattr(torch, "cuda", None), "_is_in_bad_fork", None)
    if callable(in_bad_fork) and in_bad_fork():
        return "this probe was forked from a process that had initialized CUDA"
    return None


def run_probe(factory: Callable, candidate: Candidate, budget_bytes: Optional[int], *, user_factory: bool = False,
              phase_path: Optional[Path] = None) -> ProbeResult:
    """Build and train; return the measured result. Runs in the probe process. ``phase_path``: a file kept holding
    the current phase's name (``instrument.PhaseFile``)."""
    phases = PhaseFile(phase_path)
    phases.write("setup")
    for key, value in candidate.env:
        os.environ[key] = value
    started = time.perf_counter()
    meter = None
    stage = "setup"
    clock = ProbeClock()
    others_start = others_bytes(candidate.device)
    try:
        if not candidate.real_weights:
            probe_kit.model_path(candidate)  # write the weightless checkpoint (once) outside the meter
        if candidate.engine:
            stage = "load"  # the engine's failures belong to the rung (below), not to the machine
            enter_engine(candidate)
        elif dict(candidate.user_args).get("deepspeed"):  # the user's own DeepSpeed run, launched as TRL's CLI would
            from autofit.rungs import process_env

            os.environ.update(process_env(candidate.device))
        meter = make_meter(candidate, budget_bytes)
        phases.follow(meter)
        context = meter if candidate.device == "cpu" else contextlib.nullcontext()
        offloading = activation_offload.instrumented(meter, candidate.device == "cpu") \
            if candidate.activation_offload else contextlib.nullcontext()
        sharded = simulated_fsdp.instrumented(meter) if candidate.device == "cpu" and candidate.engine in FSDP_ENGINES \
            else contextlib.nullcontext()
        with context, offloading as host_copies, sharded:
            stage = "load"
            meter.set_phase("load")
            fill = contextlib.nullcontext() if candidate.real_weights else virtual_checkpoint.fill_on_load()
            with fill, build_deadline(candidate.probe.build_timeout_s if candidate.probe is not None else None):
                trainer = factory(candidate)
            _check_trainer(trainer, candidate)
            observed = describe_trainer(trainer)
            if candidate.liger:
                kernels.check_liger_flag(trainer)
            if hasattr(meter, "track"):  # weights loaded from disk bypass the dispatch mode
                meter.track(*models_of(trainer))
            stage = "train"
            trainer.add_callback(phase_callback(meter, clock, candidate.probe))
            instrument_rl_phases(trainer, meter, clock, candidate)
            meter.set_phase("train_setup")
            trainer.train()
            if candidate.liger:
                observed["liger_modules"] = kernels.liger_patched(trainer)
            host_stats = {"host_bytes": offloaded_state(trainer, candidate, meter)} if candidate.offload else {}
            if candidate.activation_offload:
                host_stats["activation_host_bytes"] = offloaded_activations(trainer, host_copies, meter)
        peaks = meter.peaks()
        held = {phase: peak for phase, peak in peaks.items() if phase not in exempt_phases(candidate)}
        over = over_budget(held, budget_bytes) if exempt_phases(candidate) else None
        if over is not None:
            meter.phase, error = over  # where the device would have run out, for the probe's report
            raise error
        return ProbeResult(
            Outcome.OK,
            peak_bytes=max(held.values(), default=0),
            phase_peaks=peaks,
            tokens_per_second=clock.tokens_per_second(tokens_per_step(candidate, observed)),
            steps=len(clock.step_times),
            seconds=time.perf_counter() - started,
            stats={**meter.stats(), "others_start_bytes": others_start,
                   "others_end_bytes": others_bytes(candidate.device), **host_stats},
            config_class=f"{type(trainer.args).__module__}.{type(trainer.args).__qualname__}",
            config_defaults=config_defaults(type(trainer.args), candidate.training_args()),
            generation_tokens_per_second=clock.generation_tokens_per_second(),
            observed=observed,
        )
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a classified result
        outcome, fault, cause = classify_exception(exc, stage=stage, user_factory=user_factory)
        if candidate.engine and outcome is Outcome.CRASH and fault != USER and fault != INFRASTRUCTURE:
            outcome, cause = Outcome.INVALID, ENGINE_FAILURE  # the rung's, like a config TRL rejects: not the search's
        elif candidate.liger and outcome in (Outcome.CRASH, Outcome.INVALID) and fault not in (USER, INFRASTRUCTURE):
            # Liger's kernels broke it, or transformers refused the package (an ImportError, INVALID otherwise, would
            # read as the trainer rejecting the configuration): the search goes on without them
            outcome, cause = Outcome.INVALID, KERNEL_FAILURE
        log.error("probe ended with %s\n%s", outcome.value, "".join(traceback.format_exception(exc)))
        peaks = {phase: peak for phase, peak in _safe_peaks(meter).items() if phase not in exempt_phases(candidate)}
        phase = meter.phase if meter is not None and stage != "setup" else stage
        return ProbeResult(
            outcome,
            peak_bytes=max(peaks.values(), default=0),
            phase_peaks=peaks,
            steps=len(clock.step_times),
            seconds=time.perf_counter() - started,
            error=_one_line(exc),
            error_phase=phase,
            stats={**_safe_stats(meter), "others_start_bytes": others_start,
                   "others_end_bytes": others_bytes(candidate.device)},
            fault=fault,
            cause=cause,
            detail=user_frames(exc) if fault == USER else "",
            origin=error_origin(exc, stage, user_factory),
        )


def enter_engine(candidate: Candidate) -> None:
    """Write the engine's files (as the export will) and take the environment ``accelerate launch`` would give."""
    import tempfile

    from autofit.rungs import launch_env, write_engine_files

    assert candidate.engine is not None  # entered only for a candidate with an engine
    folder = Path(candidate.probe.output_dir) / "engine" if candidate.probe else Path(tempfile.mkdtemp())
    files = write_engine_files(folder, candidate.engine, candidate.device, candidate.ranks)
    os.environ.update(launch_env(files["accelerate"], candidate.device, candidate.engine))


def offloaded_state(trainer, candidate: Candidate, meter) -> int:
    """Bytes the engine holds in host memory; on the simulated meter they leave the device's peaks, and its budget
    is checked now. A trainer that did not run under the engine measured something else: an error, not a fit."""
    from autofit.probe._offloaded import host_bytes, host_tensors

    tensors = host_tensors(trainer)
    if not tensors:
        raise FactoryMisuse(
            f"the candidate offloads the optimizer ({candidate.offload}) but the trainer did not run DeepSpeed's "
            "ZeRO optimizer with offload_optimizer: build the trainer's config from candidate.training_args() "
            "inside the factory, so it sees the engine's launch environment"
        )
    if hasattr(meter, "set_host"):
        meter.set_host(tensors)
        meter.check_budget()
    return host_bytes(trainer)


def over_budget(peaks: Dict[str, int], budget_bytes: Optional[int]):
    """(phase, the out-of-memory error the device would have raised there) outside the exempt phases, checked after
    the run; None when the peaks fit."""
    import torch

    if budget_bytes is None or not peaks:
        return None
    phase, peak = max(peaks.items(), key=lambda item: item[1])
    if peak <= budget_bytes:
        return None
    return phase, torch.OutOfMemoryError(
        f"out of memory (checked after the run, generation left to vLLM): peak {peak / 2**20:.2f} MiB > budget "
        f"{budget_bytes / 2**20:.2f} MiB (phase {phase})")


def offloaded_activations(trainer, host_copies, meter) -> int:
    """The most host memory the offloaded activations took at once; on the simulated meter they leave the device's
    peaks, and its budget is checked now. A trainer that did not offload measured something else: an error."""
    if not getattr(trainer.args, "activation_offloading", False):
        raise FactoryMisuse(
            "the candidate offloads activations but the trainer's config has activation_offloading off: build the "
            "trainer's config from candidate.training_args() inside the factory"
        )
    if hasattr(meter, "check_budget"):
        meter.check_budget()
    return host_copies.peak


@contextlib.contextmanager
def build_deadline(seconds: Optional[float]):
    """Raise ``BuildTimeout`` in the factory if it has not returned within ``seconds`` (a hang in building is the
    factory's, and costs less than the whole probe's time limit)."""
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise BuildTimeout(f"the trainer factory did not return the trainer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


def user_frames(exc: BaseException) -> str:
    """The traceback frames of the user's own code (not of the libraries it called), innermost last."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if user_file(frame.filename)]
    return "".join(traceback.format_list(frames[-6:])).rstrip()


def tokens_per_step(candidate: Candidate, observed: Dict) -> int:
    """Tokens one optimizer step trains on, from what the trainer runs: RL rows are the prompt (the dataset's
    longest, else the candidate's) plus the completion; other rows are at most the dataset's longest row."""
    longest = observed.get("longest_row")
    rows = candidate.micro_batch * candidate.probe_accumulation * candidate.ranks  # the ranks step together
    if candidate.is_rl:
        completion = observed.get("args", {}).get("max_completion_length")
        completion = completion if isinstance(completion, int) else candidate.max_length
        return rows * ((longest or candidate.prompt_length or 0) + completion)
    return rows * min(longest or candidate.max_length, candidate.max_length)


def _check_trainer(trainer, candidate: Candidate) -> None:
    """A factory must return a Trainer built with the candidate's settings, or the probe measures something else."""
    from transformers import Trainer

    if not isinstance(trainer, Trainer):
        raise FactoryMisuse(
            f"the trainer factory returned {type(trainer).__module__}.{type(trainer).__qualname__}, not a "
            "transformers/TRL Trainer: return the trainer it builds (e.g. SFTTrainer(...))"
        )
    args = trainer.args
    expected = candidate.training_args()
    wrong = {
        key: (getattr(args, key, None), value)
        for key, value in expected.items()
        if key in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps")
        and getattr(args, key, None) != value
    }
    if wrong:
        raise FactoryMisuse(
            "the trainer factory ignored the candidate's settings "
            + ", ".join(f"{k}={got!r} (expected {want!r})" for k, (got, want) in wrong.items())
            + ": build the config with candidate.training_args()"
        )


def config_defaults(config_class, keys) -> Dict:
    """The config class's own defaults for ``keys``, so the export writes only what differs from them."""
    import dataclasses

    defaults = {}
    for item in dataclasses.fields(config_class):
        if item.name not in keys:
            continue
        if item.default is not dataclasses.MISSING:
            value = item.default
        elif item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
        else:
            continue
        defaults[item.name] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
    return defaults


def _safe_peaks(meter) -> Dict[str, int]:
    try:
        return meter.peaks() if meter is not None else {}
    except Exception:  # noqa: BLE001 - a broken CUDA context cannot be read any more
        return {}


def _safe_stats(meter) -> Dict:
    try:
        return meter.stats() if meter is not None else {}
    except Exception:  # noqa: BLE001 - as in _safe_peaks: the stats are best effort
        return {}


def detach_into_log(log_path: str) -> None:
    """Make this process a quiet child: its output goes to ``log_path``, and Ctrl-C (which reaches the whole
    process group) is left to the parent, which alone decides and kills it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)


def child_main(factory: FactoryPayload, candidate: Candidate, budget_bytes: Optional[int], result_path: str,
               log_path: str, env: Optional[Dict[str, str]] = None):
    """Entry point of the probe process: redirect output to the probe's log, run, write the result atomically.
    ``env``: this rank's launch variables, when the probe runs several."""
    os.environ.update(env or {})
    detach_into_log(log_path)
    record_probe_process(Path(log_path).parent)  # its log open: the mark of this folder's probe
    result = _main(factory, candidate, budget_bytes, Path(result_path).parent / PHASE_FILE)
    result.log_path = log_path
    atomic_write_text(Path(result_path), json.dumps(result.to_dict()))
    sys.stdout.flush()
    sys.stderr.flush()
    from multiprocessing import util

    # Release semaphores that libraries created, or the resource tracker warns about leaks (private: not in typeshed).
    util._run_finalizers()  # type: ignore[attr-defined]
    os._exit(0)  # skip interpreter teardown: a broken CUDA context can hang it


def _main(payload: FactoryPayload, candidate: Candidate, budget_bytes: Optional[int], phase_path: Path
          ) -> ProbeResult:
    inherited = inherited_cuda()
    if inherited is not None:
        log.error("probe not run, bad fork: %s", inherited)
        return ProbeResult(Outcome.CRASH, error=f"bad fork: {inherited}", error_phase="setup", fault=INFRASTRUCTURE,
                           cause=BAD_FORK)
    user_factory = not payload.builtin
    try:
        factory = payload.load()
    except BaseException as exc:  # noqa: BLE001 - the factory could not even be imported
        log.error("the trainer factory %s cannot be loaded\n%s", payload.name, "".join(traceback.format_exception(exc)))
        outcome, fault, cause = classify_exception(exc, stage="import", user_factory=user_factory)
        return ProbeResult(outcome, error=_one_line(exc), error_phase="import", fault=fault, cause=cause)
    result = run_probe(factory, candidate, budget_bytes, user_factory=user_factory, phase_path=phase_path)
    if result.detail and payload.files:
        result = dataclasses.replace(result, detail=payload.named_frames(result.detail))
    return result
