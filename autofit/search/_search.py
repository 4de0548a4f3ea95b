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

from typing import Callable, List, Optional, Sequence, Tuple

from autofit import memory_model
from autofit.core import SearchSpec
from autofit.probe import PlainProgress, ProbeProgress, Runner
from autofit.rungs import FailedRungs, Rung, climb
from autofit.search._ahead import ReadAhead
from autofit.search._choice import Choice
from autofit.search._faults import FaultWatch, check_no_fit_is_an_answer
from autofit.search._grid import Grid
from autofit.search._guide import MemoryGuide, model_shape
from autofit.search._host_memory import probeable_rungs
from autofit.search._probing import Prober
from autofit.search._pruning import prune
from autofit.search._refine import Refinement
from autofit.search._result import Fit, ProbeLimitReached, Record, SearchReport
from autofit.search._slots import SlotRunner
from autofit.search._speed_skip import SpeedGate
from autofit.search._speed_tie import SpeedJudge
from autofit.search._store import ProbeStore, measured_on
from autofit.search._walk import Walk

REBUILT_LEVELS = 32  # room in the study's level index for levels rebuilt without a rung


class Search:
    """The parts, each behind its own public methods: the ``grid`` places candidates, the ``prober`` measures
    them, the ``walk`` climbs the ladder (reading ahead through ``ahead``), the ``refinement`` spends the probes left,
    the pruning drops rungs a fit does not need (``autofit.search._pruning``), and the ``choice`` verifies the
    answer. ``run`` composes them."""

    def __init__(self, spec: SearchSpec, runner: Runner, rungs: Sequence[Rung], store: Optional[ProbeStore] = None,
                 on_record: Optional[Callable[[Record], None]] = None, progress: Optional[ProbeProgress] = None):
        self.spec = spec
        self.runner = runner
        self.progress = progress or PlainProgress()  # shows each probe while it runs
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
        judge = SpeedJudge(spec, self.guide, self.report.notes, self.report.records)  # ties of measured speed
        self.speed = SpeedGate(spec, judge, self.report, self.store)  # what is predicted slower is not timed
        self.faults = FaultWatch(user_factory=spec.factory is not None)
        self.failed_rungs = FailedRungs()  # rungs whose machinery could not run here (``autofit.rungs._failures``)
        self.grid = Grid(spec, self.levels, self.ladder_len, self.failed_rungs)
        self.prober = Prober(spec, runner, self.progress, self.store, self.guide, self.report, self.faults,
                             self.failed_rungs, on_record)
        self.ahead = ReadAhead(spec, runner, self.grid, self.rungs, self.start, self.guide, self.store, self.prober)
        self.walk = Walk(spec, self.grid, self.prober, self.ahead, self.guide, self.speed, self.failed_rungs,
                         self.report)
        self.choice = Choice(spec, self.grid, self.rungs, self.prober, self.guide, judge, self.report)
        self.refinement = Refinement(spec, self.grid, self.choice, self.prober, self.guide, self.store, self.report)

    @property
    def shape(self) -> Optional[memory_model.ModelShape]:
        return self.guide.shape

    @shape.setter
    def shape(self, value: Optional[memory_model.ModelShape]) -> None:  # None turns the memory model off
        self.guide.shape = value

    @property
    def judge(self) -> SpeedJudge:
        """The judge of measured speed the choice ranks with (and the pruning asks which fit is faster)."""
        return self.choice.judge

    @judge.setter
    def judge(self, value: SpeedJudge) -> None:
        self.choice.judge = value

    def run(self) -> SearchReport:
        """Walk, choose and verify. Raises ``FactoryError`` or ``InfrastructureError`` (``autofit.search._faults``) when
        probes fail for a reason that is not memory; ``self.report`` then holds what was measured until then."""
        try:
            start = 0
            while start < self.ladder_len:
                primary, fallback, stop = self.walk.run(start)
                primary += self.refinement.fits(primary, stop)
                primary, fallback = self._prune(primary, fallback)
                if self.choice.choose(primary, fallback) or self.report.probe_limit_reached:
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

    def _prune(self, primary: List[Fit], fallback: List[Fit]) -> Tuple[List[Fit], List[Fit]]:
        """Fits without the rungs they do not need (``_pruning``); the fits with them stay as fallbacks."""
        if not primary or self.report.probe_limit_reached:
            return primary, fallback
        try:
            primary, fallback, notes = prune(primary, fallback, self.grid.cost_class(self.levels[primary[0].level]),
                                             self.levels, self.rungs, self.start, self.walk.search_level,
                                             self.judge.faster, self.ahead.look_ahead_at)
        except ProbeLimitReached:
            self.report.probe_limit_reached = True
            return primary, fallback
        finally:
            self.ahead.look_ahead_at([])
        self.report.notes.extend(notes)
        return primary, fallback
