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
from autofit.core import (
    FIELDS,
    FIT,
    Candidate,
    InputError,
    Outcome,
    SearchOptions,
    SearchSpec,
    clip,
    door_fields,
    format_size,
    one_line,
)
from autofit.launch import at_door
from autofit.machine import exclusive
from autofit.probe import FactoryError, FactoryPayload, ProcessRunner, make_progress, prepare_factory
from autofit.rungs import Rung, package_of, probe_steps, register, resolve_ladder
from autofit.search import (
    InfrastructureError,
    Record,
    Search,
    SearchReport,
    no_fit_hints,
    question,
    quiet_optuna,
    slot_runner,
)

log = logging.getLogger(__name__)

FIT_OPTIONS = door_fields(FIT)  # fit()'s keywords besides the factory and the callback: SearchOptions' fields


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
    """Run the search in probe processes and write best.yaml/best.json; returns the report. ``factory``: the user's
    (``prepare_factory``); None: the built-in one of the algorithm."""
    payload = factory or prepare_factory(spec.options.algo)
    rungs = list(rungs) if rungs is not None else resolve_ladder(spec.ladder)
    with exclusive(spec.options.out_dir) as notes:
        return _search(spec, rungs, payload, callback, notes)


def _search(spec: SearchSpec, rungs: List[Rung], payload: FactoryPayload, callback, notes: List[str]) -> SearchReport:
    notes = notes + list(spec.notes)
    # The live line goes with the probes' log lines: not under -q (quiet=True), nor when stderr is not a terminal.
    progress = make_progress(quiet=not logging.getLogger("autofit.search._search").isEnabledFor(logging.INFO))
    hand_out = _hand_out(spec, payload, rungs)
    runner = hand_out or ProcessRunner(payload, spec.budget_bytes, spec.options.out_dir,
                                       timeout_s=spec.options.probe_timeout_s,
                                       build_timeout_s=spec.options.build_timeout_s, progress=progress,
                                       rung_steps=probe_steps(rungs))
    slots = slot_runner(spec, runner)
    options = spec.options
    log.info(
        "autofit: %s %s on %s, budget %s, effective batch %d, max_length %d, maximize %s%s",
        one_line(options.algo), one_line(options.model), spec.device, format_size(spec.budget_bytes),
        options.effective_batch, spec.max_length, options.maximize,
        f", your factory {one_line(payload.name)}" if not payload.builtin else "",
    )
    try:
        with quiet_optuna():
            search = Search(spec, slots or runner, rungs, on_record=callback, progress=progress)
            search.report.notes[:0] = notes
            try:
                search.run()
                if hand_out is not None and hand_out.lost:
                    search.report.notes.append(f"{hand_out.lost} probe(s) handed out again: their worker gave no "
                                               f"heartbeat for {spec.options.worker_silence_s:g} s")
            except (FactoryError, InfrastructureError):
                export.write(search.report, spec.options.out_dir)  # best.json says what was measured and why it stopped
                raise
    finally:  # each closed even when the one before it is interrupted (a second Ctrl-C): the queue above all
        with contextlib.ExitStack() as closing:
            closing.callback(progress.close)
            if hand_out is not None:
                closing.callback(hand_out.close)
            if slots is not None:
                closing.callback(slots.close)
    export.write(search.report, spec.options.out_dir)
    write_report(spec.options.out_dir)
    return search.report


def _hand_out(spec: SearchSpec, payload: FactoryPayload, rungs: List[Rung]):
    """The runner that hands probes out to ``autofit worker`` processes (``--workers``); None where probes run here."""
    options = spec.options
    if options.workers is None:
        return None
    from autofit.workers import HandOutRunner

    location = options.worker_queue or str(options.out_dir)
    runner = HandOutRunner(location, options.out_dir, payload, spec.budget_bytes, timeout_s=options.probe_timeout_s,
                           lost_after_s=options.worker_silence_s, build_timeout_s=options.build_timeout_s,
                           rung_steps=probe_steps(rungs))
    log.info("autofit: probes are handed out to %d worker(s): start `autofit worker --study %s` where they run",
             options.workers, runner.location)
    return runner


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


def no_fit_message(report: SearchReport) -> str:
    spec = report.spec
    failure = report.lightest_failure()
    last = report.levels[report.ladder_len - 1 if report.ladder_len else -1]
    if failure is not None:
        seen = (f"the lightest configuration tried ({'+'.join(failure.candidate.rungs) or 'baseline'}: "
                f"{failure.candidate.describe()}) needed more than {format_size(failure.result.peak_bytes)}")
    elif report.skipped and not report.records:
        lightest = min(report.skipped, key=lambda s: s.predicted_bytes)
        seen = (f"the memory model puts the lightest configuration "
                f"({'+'.join(lightest.candidate.rungs) or 'baseline'}: {lightest.candidate.describe()}) "
                f"at {format_size(lightest.predicted_bytes)} ± {lightest.uncertainty:.0%}, "
                "so nothing was probed (--no-predict probes anyway)")
    else:
        errors = sorted({r.result.error for r in report.records if r.result.error})
        seen = "no probe ran to completion" + (f" (first error: {clip(errors[0], 200)})" if errors else "")
    if report.probe_limit_reached:  # the ladder was not walked to its end: no claim about the rungs not reached
        reached = max([r.level for r in report.records] + [s.level for s in report.skipped], default=0)
        untried = [name for name in last.rungs if name not in report.levels[reached].rungs]
        return (
            f"nothing fitted in {format_size(spec.budget_bytes)} within --max-probes {spec.options.max_probes}: the "
            f"search stopped at {'+'.join(report.levels[reached].rungs) or 'the baseline'} ({seen})"
            + (f"; not tried: {', '.join(untried)}" if untried else "")
            + ". Run it again with a larger --max-probes: it resumes from what was measured."
        )
    refused = _refused_levels(report)
    if refused and failure is not None:  # the rungs of a level no probe measured are no claim: the deepest measured
        last = report.levels[failure.level]
    return (
        f"nothing fits in {format_size(spec.budget_bytes)} even with {', '.join(last.rungs) or 'no rung'}: {seen}"
        + (f"; not measured: {refused}" if refused else "")
        + ". " + no_fit_hints(report)
    )


def _refused_levels(report: SearchReport) -> str:
    """The levels whose every probe the libraries (or a rung's own step) refused (INVALID): each by its rung, the
    package that offers it where it is another package's, and the first refusal."""
    by_level: Dict[int, List[Record]] = {}
    for record in report.records:
        by_level.setdefault(record.level, []).append(record)
    parts = []
    for level, records in sorted(by_level.items()):
        if not all(record.result.outcome is Outcome.INVALID for record in records):
            continue
        rung = report.levels[level].rungs[-1] if report.levels[level].rungs else "the baseline"
        owner = package_of(rung)
        parts.append(f"{rung}{f' of {owner}' if owner else ''}, every probe of its level refused "
                     f"({clip(records[0].result.error or 'INVALID', 160)})")
    return "; ".join(parts)


def fit(trainer_factory: Union[str, Callable[[Candidate], Any]], *,
        callback: Optional[Callable[[Record], None]] = None, **options: Any) -> FitResult:
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
    unknown = sorted(set(options) - set(FIT_OPTIONS))
    if unknown:
        raise TypeError(f"fit() got an unexpected keyword argument '{unknown[0]}'")
    payload = prepare_factory(trainer_factory)
    ladder = options.get("ladder")
    custom = ladder is not None and not isinstance(ladder, str) and any(not isinstance(r, str) for r in ladder)
    values, launch = at_door({**options, "ladder": None if custom else ladder})
    spec = question(SearchOptions(**values), factory=payload.identity or None, launch=launch)
    rungs = ([resolve_ladder([r])[0] if isinstance(r, str) else r for r in ladder]
             if custom and ladder is not None else None)
    for rung in rungs or ():
        try:
            register(rung)  # the stages (export, the memory model) find its words and its ledger by its name
        except ValueError as exc:
            raise InputError(str(exc)) from None
    # Optuna's verbosity is global: WARNING while fit runs (the search and the report read the study), the caller's
    # own after it returns or raises
    with probe_lines(bool(options.get("quiet", False))), quiet_optuna():
        report = run_search(spec, rungs, payload, callback)
    if not report.fits:
        raise NoFitError(no_fit_message(report), report)
    assert report.chosen is not None  # it fits
    return FitResult(report.chosen.candidate, report, spec.options.out_dir / "best.json",
                     spec.options.out_dir / "best.yaml")


def _signature() -> inspect.Signature:
    """fit()'s signature as help() and editors show it: the factory, every option of the fit door with its default
    (``model`` may come from ``config``), and the callback."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = [inspect.Parameter("trainer_factory", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name in FIT_OPTIONS:
        required = FIT in FIELDS[name].metadata["required"]
        parameters.append(inspect.Parameter(name, keyword, default=inspect.Parameter.empty if required
                                            else FIELDS[name].default))
    parameters.append(inspect.Parameter("callback", keyword, default=None))
    return inspect.Signature(parameters)


fit.__signature__ = _signature()  # type: ignore[attr-defined]


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
