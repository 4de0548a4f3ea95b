"""The Python API, ``autofit.fit``, and the one orchestration that the CLI shares with it."""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from autofit import export
from autofit.core import Candidate
from autofit.probe import FactoryError, FactoryPayload, prepare_factory
from autofit.search import InfrastructureError
from autofit.core import one_line
from autofit.rungs import Rung
from autofit.rungs import resolve_ladder
from autofit.core import UnknownModelError, resolve_model
from autofit.probe import ProcessRunner
from autofit.search import check_model_code, check_model_sizes, search_spec
from autofit.core import free_bytes, other_processes
from autofit.core import exclusive
from autofit.probe import make_progress
from autofit.search import Record, SearchReport
from autofit.search import Search
from autofit.core import InputError
from autofit.core import SearchSpec
from autofit.core import format_size
from autofit.search import quiet_optuna
from autofit.search import reserve_share

log = logging.getLogger(__name__)

# fit()'s keywords that are the search's options (the rest: the factory, quiet, the callback)
SEARCH_OPTIONS = frozenset(inspect.signature(search_spec).parameters) - {"factory"}


class NoFitError(RuntimeError):
    """Nothing fits the budget, even at the last rung of the ladder."""

    def __init__(self, message: str, report: SearchReport):
        super().__init__(message)
        self.report = report


@dataclass
class FitResult:
    """What ``fit`` found: the chosen ``candidate`` (``training_args`` for your config class, ``peft_config()``,
    ``quantization_config()``), the whole ``report`` (every probe, skip and note), and the files written:
    ``best_yaml`` (for ``trl <algo> --config``), ``best_json`` (the same, structured, with the measurements) and
    ``report_html`` (the answer, why, and the plots)."""

    candidate: Candidate
    report: SearchReport
    best_json: Path
    best_yaml: Path

    @property
    def report_html(self) -> Path:
        return self.best_json.with_name("report.html")

    @property
    def training_args(self) -> Dict[str, Any]:
        return self.candidate.training_args()

    def __repr__(self) -> str:
        verified = self.report.verified
        peak = format_size(verified.peak_bytes) if verified is not None else "-"
        rungs = ", ".join(self.candidate.rungs) or "no rung needed"
        rate = f", {verified.tokens_per_second:,.0f} tok/s" if verified is not None else ""
        return (f"FitResult({self.candidate.describe()} [{rungs}], verified peak {peak} of "
                f"{format_size(self.report.spec.budget_bytes)}{rate}; {self.best_yaml})")


def run_search(spec: SearchSpec, rungs: Optional[Iterable[Rung]] = None, factory: Optional[FactoryPayload] = None,
               callback: Optional[Callable[[Record], None]] = None) -> SearchReport:
    """Validate the model, run the search in probe processes, write best.yaml/best.json; returns the report.
    ``factory``: the user's (``prepare_factory``); None: the built-in one of ``spec.algo``."""
    try:
        source = resolve_model(spec.model)
    except UnknownModelError as exc:
        raise InputError(str(exc)) from None
    config = source.config.get("text_config") if isinstance(source.config.get("text_config"), dict) else source.config
    if not spec.real_weights and not isinstance(config.get("vocab_size"), int):
        raise InputError(f"model '{one_line(spec.model)}': its configuration has no \"vocab_size\" (an integer), which "
                         "the synthesized tokenizer of random-weight probes needs; add it, or use --real-weights")
    check_model_code(spec.model, source.config, spec.trust_remote_code)
    check_model_sizes(spec, source.config)
    payload = factory or prepare_factory(spec.algo)
    rungs = list(rungs) if rungs is not None else resolve_ladder(spec.ladder)
    with exclusive(spec.out_dir) as notes:
        return _search(spec, rungs, payload, callback, notes)


def _search(spec: SearchSpec, rungs: List[Rung], payload: FactoryPayload, callback, notes: List[str]) -> SearchReport:
    notes = notes + check_device_is_free(spec) + reserve_share(spec)
    # The live line goes with the probes' log lines: not under -q (quiet=True), nor when stderr is not a terminal.
    progress = make_progress(quiet=not logging.getLogger("autofit.search._search").isEnabledFor(logging.INFO))
    runner = ProcessRunner(payload, spec.budget_bytes, spec.out_dir, timeout_s=spec.probe_timeout_s,
                           build_timeout_s=spec.build_timeout_s, progress=progress)
    log.info(
        "autofit: %s %s on %s, budget %s, effective batch %d, max_length %d, maximize %s%s",
        one_line(spec.algo), one_line(spec.model), spec.device, format_size(spec.budget_bytes), spec.effective_batch,
        spec.max_length, spec.maximize, f", your factory {one_line(payload.name)}" if not payload.builtin else "",
    )
    try:
        with quiet_optuna():
            search = Search(spec, runner, rungs, on_record=callback, progress=progress)
            search.report.notes[:0] = notes
            try:
                search.run()
            except (FactoryError, InfrastructureError):
                export.write(search.report, spec.out_dir)  # best.json says what was measured and why it stopped
                raise
    finally:
        progress.close()
    export.write(search.report, spec.out_dir)
    write_report(spec.out_dir)
    return search.report


def write_report(out_dir: Path) -> Optional[Path]:
    """report.html beside best.json. A by-product: a failure to draw it is logged, and the search's answer stands."""
    from autofit import report as report_html

    try:
        path = report_html.write(out_dir)
    except Exception as exc:  # noqa: BLE001 - matplotlib, a damaged study: the answer is already written
        (out_dir / report_html.REPORT_FILE).unlink(missing_ok=True)  # an earlier search's page would mislead
        log.warning("report.html was not written (%s: %s); `autofit report %s` draws it again",
                    type(exc).__name__, one_line(exc), out_dir)
        return None
    log.debug("report: %s", path)
    return path


# An idle card's free memory is a little under its total (driver reservations): not "busy".
CUDA_IDLE_SLACK_BYTES = 2**30


def check_device_is_free(spec: SearchSpec) -> List[str]:
    """Before probing: other processes must leave the budget free on every GPU the search uses, or probes run out of
    memory for reasons that are not the candidate's. With ``allow_busy_gpu`` the budget becomes what is free on the
    busiest of them (returned as a note)."""
    ranks = range(spec.ranks) if spec.device == "cuda" else range(1)  # the simulated device is the machine's
    frees = [(free_bytes(spec.device, spec.budget_bytes, rank), rank) for rank in ranks]
    known = [(free, rank) for free, rank in frees if free is not None]
    if not known or spec.budget_bytes is None:
        return []
    free, rank = min(known)
    slack = CUDA_IDLE_SLACK_BYTES if spec.device == "cuda" else 0
    if free + slack >= spec.budget_bytes:
        return []
    holders = "; ".join(p.describe() for p in other_processes(spec.device, rank=rank)) or \
        "other processes (not listed by NVML)"
    holders += f" (GPU {rank} of the search's {spec.ranks})" if spec.ranks > 1 else ""
    if not spec.allow_busy_gpu:
        raise InputError(f"the device has {format_size(max(free, 0))} free, less than the budget "
                         f"{format_size(spec.budget_bytes)}: {holders}; free it, lower --gpu-memory, or pass "
                         "--allow-busy-gpu to search within what is free")
    if free <= 0:
        raise InputError(f"the device has no memory free: {holders}")
    note = (f"the device was busy ({holders}): the budget is what was free when the search started, "
            f"{format_size(free)} instead of {format_size(spec.budget_bytes)}")
    spec.budget_bytes = free
    log.warning("%s", note)
    return [note]


def no_fit_message(report: SearchReport) -> str:
    spec = report.spec
    failure = report.lightest_failure()
    last = report.levels[report.ladder_len - 1 if report.ladder_len else -1]
    if failure is not None:
        seen = (f"the lightest configuration tried ({'+'.join(failure.candidate.rungs) or 'baseline'}: "
                f"{failure.candidate.describe()}) needed more than {format_size(failure.result.peak_bytes)}")
    elif report.skipped and not report.records:
        lightest = min(report.skipped, key=lambda s: s.predicted_bytes)
        seen = (f"the memory model puts the lightest configuration ({'+'.join(lightest.candidate.rungs) or 'baseline'}: "
                f"{lightest.candidate.describe()}) at {format_size(lightest.predicted_bytes)} "
                f"± {lightest.uncertainty:.0%}, so nothing was probed (--no-predict probes anyway)")
    else:
        errors = sorted({r.result.error for r in report.records if r.result.error})
        seen = "no probe ran to completion" + (f" (first error: {errors[0][:200]})" if errors else "")
    return (
        f"nothing fits in {format_size(spec.budget_bytes)} even with {', '.join(last.rungs) or 'no rung'}: {seen}. "
        "Try a larger --gpu-memory, a lower --min-length, a smaller --effective-batch, or more rungs in --ladder."
    )


def fit(
    trainer_factory: Union[str, Callable[[Candidate], Any]],
    *,
    model: str,
    algo: str = "sft",
    gpu_memory: Union[None, str, int] = None,
    device: str = "auto",
    max_length: Optional[int] = None,
    min_length: Optional[int] = None,
    max_completion_length: Optional[int] = None,
    min_completion_length: Optional[int] = None,
    max_prompt_length: int = 128,
    num_generations: Optional[int] = None,
    beta: Optional[float] = None,
    effective_batch: int = 8,
    gpus: Union[int, str] = 1,
    nodes: int = 1,
    use_vllm: Optional[str] = None,
    vllm_gpu_memory_utilization: float = 0.3,
    maximize: str = "batch",
    ladder: Union[None, str, Iterable[Union[str, Rung]]] = None,
    out_dir: Union[str, Path] = "autofit-out",
    real_weights: bool = False,
    dtype: Optional[str] = None,
    probe_steps: int = 2,
    verify_steps: Union[int, str] = "auto",
    probe_timeout_s: float = 900.0,
    build_timeout_s: float = 600.0,
    max_probes: Optional[int] = None,
    headroom: Optional[float] = None,
    predict: bool = True,
    allow_busy_gpu: bool = False,
    trust_remote_code: bool = False,
    quiet: bool = False,
    training_args: Optional[Dict[str, Any]] = None,
    callback: Optional[Callable[[Record], None]] = None,
) -> FitResult:
    """Find the best configuration of your own trainer that fits the memory budget.

    ``trainer_factory(candidate)`` builds a ready transformers/TRL ``Trainer`` from the candidate's settings:
    ``YourConfig(**candidate.training_args())``, ``peft_config=candidate.peft_config()``,
    ``quantization_config=candidate.quantization_config()``. Any callable works (a module function, a function
    of a script or a notebook cell, a closure, a lambda): it crosses to the probe processes by value, with the
    names it uses; "package.module:function" is imported there by name instead.

    Every other keyword is the ``autofit search`` option of the same name (``--max-probes`` is ``max_probes``,
    ``--no-predict`` is ``predict=False``, ``--out`` is ``out_dir``, ``-q`` is ``quiet``). ``training_args``
    are your own config fields, passed through (autofit's searched fields replace yours, with a warning).
    ``callback(record)`` receives each probe (``autofit.report.Record``) as it ends. One line per probe is logged
    to stderr unless logging is configured or ``quiet=True``; logging and Optuna settings are left as found.

    Raises ``InputError`` on bad input, ``FactoryError`` (an ``InputError``) when your factory fails: an exception
    from your own code, a return value that is not a Trainer built from the candidate, a hang while building
    (``build_timeout_s``), or the same error on two candidates; ``InfrastructureError`` when probes cannot run on
    this machine; ``NoFitError`` when nothing fits.
    """
    options = {name: value for name, value in locals().items() if name in SEARCH_OPTIONS}
    payload = prepare_factory(trainer_factory)
    custom = ladder is not None and not isinstance(ladder, str) and any(not isinstance(r, str) for r in ladder)
    spec = search_spec(**{**options, "ladder": None if custom else ladder}, factory=payload.identity or None)
    rungs = [resolve_ladder([r])[0] if isinstance(r, str) else r for r in ladder] if custom else None
    with probe_lines(quiet):
        report = run_search(spec, rungs, payload, callback)
    if not report.fits:
        raise NoFitError(no_fit_message(report), report)
    return FitResult(report.chosen.candidate, report, spec.out_dir / "best.json", spec.out_dir / "best.yaml")


@contextlib.contextmanager
def probe_lines(quiet: bool):
    """One line per probe on stderr while ``fit`` runs, unless the caller configured logging or asked for quiet;
    the ``autofit`` logger is left as it was found."""
    logger = logging.getLogger("autofit")
    level, handler = logger.level, None
    if quiet:
        logger.setLevel(logging.WARNING)
    elif not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(level)
        if handler is not None:
            logger.removeHandler(handler)
