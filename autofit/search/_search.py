"""The search: walk the ladder, find the largest micro-batch (or longest sequence) that fits at each level, choose,
and verify the choice with a longer run.

Rules (see DESIGN.md, "The ladder"):
- Levels are visited from free to costly. The first level where anything fits fixes the cost class (with
  ``maximize="length"`` the free and speed classes count as one: a longer sequence with the same math wins).
- Within the free and speed classes the remaining levels of that class are tried too, unless a fit already
  reaches the top of the range (the largest micro-batch, or the full length); the fastest measured fit wins.
- Within the quality class the first level that fits wins: its rungs change the training least.
- A candidate the memory model puts over the budget even at the low end of its error band is not probed (a
  whole level is passed over when its lightest candidate is); nor, once a level of the free or speed class has a
  fit, one the throughput model predicts slower than it beyond its band (``_speed_skip``). Skips are reported.
- Fits are measured against the budget minus a margin: the headroom, or the memory model's measured error on this
  search's probes when that is larger (up to ``MAX_MARGIN``). A better fit rejected only by the margin is verified,
  and kept when the verification shows no drift or allocator retries that would break it (``autofit.search._margin``).
- With ``--max-probes``, the probes the walk left unused go to an Optuna sampler that looks for a faster fit in
  the winning cost class (see ``autofit.search._refine``).
- The chosen configuration is verified for ``verify_steps`` optimizer steps under the same budget; if that run
  does not fit, the next-best fit is verified instead.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, List, Optional, Sequence, Tuple

from autofit import memory_model
from autofit.core import INFRASTRUCTURE, Candidate, InputError, Outcome, ProbeResult, SearchSpec, format_size
from autofit.memory_model import divisors, length_grid
from autofit.probe import PlainProgress, ProbeProgress, Runner
from autofit.rungs import FREE, QUALITY, SPEED, FailedRungs, LadderState, Rung, climb
from autofit.search._ahead import bisection, branches, next_levels, start_ahead
from autofit.search._choice import choose
from autofit.search._faults import FaultWatch, check_no_fit_is_an_answer, retry_note
from autofit.search._guide import MemoryGuide, model_shape
from autofit.search._host_memory import probeable_rungs
from autofit.search._pruning import prune
from autofit.search._refine import refine_fits
from autofit.search._result import Fit, ProbeLimitReached, Record, SearchReport, Skip, undominated
from autofit.search._slots import SlotRunner
from autofit.search._speed_skip import SpeedGate
from autofit.search._speed_tie import SpeedJudge
from autofit.search._store import ProbeStore, measured_on

log = logging.getLogger(__name__)

REBUILT_LEVELS = 32  # room in the study's level index for levels rebuilt without a rung


class Search:
    def __init__(self, spec: SearchSpec, runner: Runner, rungs: Sequence[Rung], store: Optional[ProbeStore] = None,
                 on_record: Optional[Callable[[Record], None]] = None, progress: Optional[ProbeProgress] = None):
        self.spec = spec
        self.runner = runner
        self.progress = progress or PlainProgress()  # shows each probe while it runs
        self.on_record = on_record
        self.start = memory_model.start_state(spec, memory_model.shape_or_none(spec.options.model))  # facts of rungs
        self.rungs, unavailable = probeable_rungs(self.start, rungs, spec.options.model, spec.device)
        self.levels = climb(self.start, self.rungs)
        self.ladder_len = len(self.levels)  # levels past it are rebuilt without a rung (autofit.search._pruning)
        self.store = store or ProbeStore(spec.options.out_dir, spec.study_name(), spec.budget_bytes,
                                         self.ladder_len + REBUILT_LEVELS, spec.options.effective_batch,
                                         spec.max_length, measured_on(spec), spec.question_key())
        self.report = SearchReport(spec, self.levels, ladder_len=self.ladder_len, fingerprint=self.store.fingerprint)
        self.report.notes.extend(getattr(self.store, "notes", []))
        self.report.notes.extend(unavailable)
        self.guide = MemoryGuide(spec, self.report, model_shape(spec) if spec.options.predict else None)
        self.judge = SpeedJudge(spec, self.guide, self.report.notes, self.report.records)  # ties of measured speed
        self.speed = SpeedGate(spec, self.judge, self.report, self.store)  # what is predicted slower is not timed
        self.faults = FaultWatch(user_factory=spec.factory is not None)
        self.failed_rungs = FailedRungs()  # rungs whose machinery could not run here (``autofit.rungs._failures``)
        self.ahead_levels: List[LadderState] = []  # levels outside the ladder a pass may search next (``_ahead``)

    @property
    def shape(self) -> Optional[memory_model.ModelShape]:
        return self.guide.shape

    @shape.setter
    def shape(self, value: Optional[memory_model.ModelShape]) -> None:  # None turns the memory model off
        self.guide.shape = value

    # -- predicting -------------------------------------------------------------------------------------------
    def _ruled_out(self, level: int, candidate: Candidate) -> Optional[memory_model.Ledger]:
        """The prediction (reported as a skip) when even the low end of its error band is over the budget: the
        candidate is not probed. None when it may fit, or when the model is not to be trusted with it."""
        if self.store.lookup(candidate, "probe", self.spec.options.probe_steps) is not None:
            return None  # measured already (in this run or a stored one): its answer costs nothing
        ledger = self._over_at_low_end(candidate)
        if ledger is None:
            return None
        if not any(s.candidate.key() == candidate.key() for s in self.report.skipped):
            self.report.skipped.append(Skip(level, candidate, ledger.total, ledger.uncertainty))
            log.info("skip  [%s] %s: predicted %s ± %.0f%%, over %s even at the low end",
                     "+".join(candidate.rungs) or "baseline", candidate.describe(), format_size(ledger.total),
                     100 * ledger.uncertainty, format_size(self.guide.limit()))
        return ledger

    def _over_at_low_end(self, candidate: Candidate) -> Optional[memory_model.Ledger]:
        """The prediction, where even the low end of its error band is over the budget's limit."""
        if self.spec.factory is not None and self.guide.calibration is None:
            return None  # the ledger describes the built-in trainers; a custom one is trusted once measured
        ledger = self.guide.ledger(candidate)
        return ledger if ledger is not None and ledger.low > self.guide.limit() else None

    # -- measuring --------------------------------------------------------------------------------------------
    def _measure(self, level: int, candidate: Candidate, kind: str = "probe", stage: str = "walk") -> ProbeResult:
        if kind == "verify":
            key, (steps, min_steps, cap) = self.spec.options.verify_steps, self.spec.verify_plan()
            if isinstance(self.runner, SlotRunner):
                self.runner.drain()  # a verification's timing is the one measured alone
        else:
            key, steps, min_steps, cap = self.spec.options.probe_steps, self.spec.options.probe_steps, 0, None
        limit = self.spec.options.max_probes
        if (kind == "probe" and limit is not None and self.store.lookup(candidate, kind, key) is None
                and self.store.probes_spent >= limit):  # the study's total: a resumed search counts its own
            raise ProbeLimitReached()
        predicted, prior = self.guide.predict(candidate), self.guide.predict(candidate, calibrated=False)
        calibration = self.guide.calibration.method if self.guide.calibration is not None else "prior"
        run = self.progress.around(lambda: self.runner.run(candidate, steps, min_steps=min_steps, time_cap_s=cap),
                                   len(self.report.records) + 1, level, kind, candidate, predicted,
                                   self.spec.budget_bytes)
        result, cached = self.store.measure(candidate, kind, key, level, run)
        if cached and self.guide.implausible(candidate, result):
            result, cached = self.store.measure(candidate, kind, key, level, run, fresh=True)
        if not cached and result.outcome is Outcome.CRASH and result.fault == INFRASTRUCTURE:  # the machine's: again
            log.info("%s", Record(level, candidate, kind, result, cached, predicted, prior).log_line(
                len(self.report.records) + 1) + "; not the candidate's failure: run once more")
            first, (result, _) = result, self.store.measure(candidate, kind, key, level, run, fresh=True)
            self.report.notes.append(retry_note(candidate, first, result))
        if not cached:
            self.faults.observe(candidate, result)
        failure_note = self.failed_rungs.observe(candidate, result)
        if failure_note:
            self.report.notes.append(failure_note)
        self.report.notes.extend(self.guide.observe(candidate, result))
        if not self.report.records and result.outcome is Outcome.INVALID and result.error_phase == "load":
            # The trainer rejected the very first configuration (TRL validates its own invariants): bad input.
            raise InputError(f"the trainer rejects this configuration: {result.error}")
        if any(r.candidate.key() == candidate.key() and r.kind == kind for r in self.report.records):
            return result  # already measured and listed in this run (the same point reached from another level)
        record = Record(level, candidate, kind, result, cached, predicted, prior,
                        "verify" if kind == "verify" else stage, calibration)
        self.report.records.append(record)
        if kind == "probe":
            self.guide.learn(result)
        log.info("%s", record.log_line(len(self.report.records)))
        if self.on_record is not None:
            self.on_record(record)
        return result

    def _largest(self, level: int, values: Sequence[int], make: Callable[[int], Candidate],
                 top_apart: bool = False) -> List[Fit]:
        """The largest value that fits, memory assumed to grow with the value. Returns every fit found, the
        largest first.

        The memory model picks the first probe: the largest value predicted to fit. If it fits, the next value is
        probed to confirm it is the largest (climbing on if that fits too); else the values below it are bisected.
        When memory grows with the value the answer is plain bisection's and the model only saves probes.

        ``top_apart``: the top value is the micro-batch without accumulation, which memory does not order with the
        others (from accumulation 2 on, gradients stay resident between micro-batches, so at short sequences
        micro-batch 1 can need more than the full batch). With the model, the top is then tried whenever the
        search did not reach it, unless the model rules it out."""
        fits: List[Fit] = []
        tried = set()
        history: List[Tuple[int, bool]] = []
        top = len(values) - 1
        start = self.guide.predicted_start(values, make)

        def fits_at(index: int) -> bool:
            tried.add(index)
            candidate = make(values[index])
            if self._ruled_out(level, candidate) is not None or self.failed_rungs.skipped(candidate):
                return False
            if self.speed.skips(level, candidate):  # not timed, predicted slower: a larger value may be faster
                return True
            if isinstance(self.runner, SlotRunner):
                width = len(self.runner.slots.devices)
                inner = branches(start, top, history, index, width)
                if top_apart and self.guide.shape is not None and top not in tried | set(inner):
                    inner.append(top)
                nearest, later = [make(values[i]) for i in inner[:2]], [make(values[i]) for i in inner[2:]]
                outer = next_levels(self, level, width)
                start_ahead(self, candidate, nearest + outer[:1] + later + outer[1:])
            result = self._measure(level, candidate)
            if self.guide.fits(result):
                fits.append(Fit(level, candidate, result))
                return True
            return False

        walk = bisection(start, top)
        try:
            index = next(walk)
            while True:
                fitted = fits_at(index)
                history.append((index, fitted))
                index = walk.send(fitted)
        except StopIteration:
            pass
        if top_apart and self.guide.shape is not None and top not in tried:
            fits_at(top)
        return sorted(fits, key=lambda f: self._size(f.candidate), reverse=True)

    def _at(self, state: LadderState, batch: int, length: int) -> Candidate:
        """The level's candidate at micro-batch ``batch`` and ``length``."""
        per_rank = self.spec.rank_batch
        candidate = state.candidate.replace(micro_batch=batch, grad_accum=per_rank // batch, max_length=length)
        return self.failed_rungs.runnable(candidate)

    def _size(self, candidate: Candidate) -> Tuple[int, int]:
        size = candidate.micro_batch, candidate.max_length
        return size[::-1] if self.spec.options.maximize == "length" else size

    # -- one level --------------------------------------------------------------------------------------------
    def _search_level(self, level: int, state: LadderState) -> List[Fit]:
        spec = self.spec
        per_rank = spec.rank_batch
        batches = divisors(per_rank) if state.vary_batch else [state.candidate.micro_batch]  # the level's own

        def at(batch: int, length: int) -> Candidate:
            return self._at(state, batch, length)

        if spec.options.maximize == "length":
            grid = length_grid(spec.min_length, spec.max_length)
            return self._largest(level, grid, lambda length: at(batches[0], length))
        fits = self._largest(level, batches, lambda batch: at(batch, spec.max_length), top_apart=True)
        if not fits and state.vary_length:
            shorter = length_grid(spec.min_length, spec.max_length)[:-1]
            by_length = self._largest(level, shorter, lambda length: at(batches[0], length))
            if by_length:
                length = by_length[0].candidate.max_length
                fits = self._largest(level, batches, lambda batch: at(batch, length), top_apart=True) + by_length[1:]
        return fits

    def _at_top(self, fit: Fit) -> bool:
        if self.spec.options.maximize == "length":
            return fit.candidate.max_length == self.spec.max_length
        state = self.levels[fit.level]
        largest = self.spec.rank_batch if state.vary_batch else state.candidate.micro_batch
        return fit.candidate.micro_batch == largest and fit.candidate.max_length == self.spec.max_length

    # -- the walk ---------------------------------------------------------------------------------------------
    def run(self) -> SearchReport:
        """Walk, choose and verify. Raises ``FactoryError`` or ``InfrastructureError`` (``autofit.search._faults``) when
        probes fail for a reason that is not memory; ``self.report`` then holds what was measured until then."""
        try:
            start = 0
            while start < self.ladder_len:
                primary, fallback, stop = self._walk(start)
                primary += self._refine(primary, stop)
                primary, fallback = self._prune(primary, fallback)
                if self._choose(primary, fallback) or self.report.probe_limit_reached:
                    break
                # every fit failed its verification: they do not really fit, so climb on from where the walk stopped
                start = stop
            if not self.report.fits:
                check_no_fit_is_an_answer(self.report.records, bool(self.report.skipped))
        except Exception as exc:
            self.report.stopped = str(exc)
            raise
        finally:
            self.report.calibration = self.guide.calibration
            self.report.margin = self.guide.margin()
            self.report.probes_run = self.store.probes_run
            self.report.probes_total = self.store.probes_total
            if isinstance(self.runner, SlotRunner):
                self.report.side_by_side = self.runner.use()
            self.speed.finish()
        return self.report

    def _walk(self, start: int) -> Tuple[List[Fit], List[Fit], int]:
        """Visit levels from ``start`` until a cost class has fits; returns (primary, fallback, next level)."""
        primary: List[Fit] = []  # the best fit of each level
        fallback: List[Fit] = []  # smaller fits, in case a verification fails
        cost = None
        self.speed.compare([], None)  # no measured fit to compare with yet (``_speed_skip``)
        for level in range(start, self.ladder_len):
            state = self.levels[level]
            if cost is not None and (self._class(state) != cost or cost == QUALITY or any(map(self._at_top, primary))):
                return primary, fallback, level
            try:
                fits = self._search_level(level, state)
            except ProbeLimitReached:
                self.report.probe_limit_reached = True
                self.report.notes.append(f"--max-probes {self.spec.options.max_probes} reached: the search stopped "
                                         "there")
                fits = [f for f in self._fits_so_far(level) if f not in primary + fallback]
                if fits:
                    primary.append(fits[0])
                    fallback.extend(fits[1:])
                return primary, fallback, self.ladder_len
            if fits:
                cost = cost or self._class(state)
                primary.append(fits[0])
                fallback.extend(fits[1:])
                self.speed.compare(primary + fallback, cost)
        return primary, fallback, self.ladder_len

    def _look_ahead_at(self, states: List[LadderState]) -> None:
        self.ahead_levels = states

    def _prune(self, primary: List[Fit], fallback: List[Fit]) -> Tuple[List[Fit], List[Fit]]:
        """Fits without the rungs they do not need (``_pruning``); the fits with them stay as fallbacks."""
        if not primary or self.report.probe_limit_reached:
            return primary, fallback
        try:
            primary, fallback, notes = prune(primary, fallback, self._class(self.levels[primary[0].level]),
                                             self.levels, self.rungs, self.start, self._search_level,
                                             self.judge.faster, self._look_ahead_at)
        except ProbeLimitReached:
            self.report.probe_limit_reached = True
            return primary, fallback
        finally:
            self.ahead_levels = []
        self.report.notes.extend(notes)
        return primary, fallback

    # -- refining ---------------------------------------------------------------------------------------------
    def _refine(self, primary: List[Fit], stop: int) -> List[Fit]:
        return refine_fits(self, primary, stop)

    def _score(self, result: ProbeResult) -> Tuple[float, float]:
        """(tokens per second, peak minus the budget's limit) as the sampler reads them."""
        limit = self.guide.limit()
        over = result.peak_bytes - limit if math.isfinite(limit) else -1.0
        if self.guide.fits(result):
            return result.tokens_per_second, min(over, 0.0)
        return 0.0, max(over, 1.0)

    def _fits_so_far(self, level: int) -> List[Fit]:
        return sorted((Fit(level, r.candidate, r.result) for r in self.report.records if r.level == level
                       and r.kind == "probe" and self.guide.fits(r.result)), key=lambda f: self._size(f.candidate),
                      reverse=True)

    def _class(self, state: LadderState) -> str:
        """The cost class a level competes in (when the length is maximized, free and speed rungs compete together)."""
        return SPEED if self.spec.options.maximize == "length" and state.cost == FREE else state.cost

    def _rank(self, fits: List[Fit]) -> List[Fit]:
        return self.judge.rank(undominated(fits))

    def _choose(self, primary: List[Fit], fallback: List[Fit]) -> bool:
        return choose(self, primary, fallback)
