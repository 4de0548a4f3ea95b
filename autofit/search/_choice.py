"""The choice among the fits the walk found, verified: the best fit by the cost class, speed and size (``rank``), a
better fit the margin alone rejected verified first (``autofit.search._margin``), a tie of measured speed settled
(``autofit.search._speed_tie``), and the next-best one verified where the first does not hold over the longer
verification run."""

from __future__ import annotations

from typing import List, Optional, Sequence

from autofit.core import SearchSpec, clip
from autofit.rungs import Rung
from autofit.search._grid import Grid
from autofit.search._guide import MemoryGuide
from autofit.search._margin import best_margin_only_fit, evidence, within_margin
from autofit.search._probing import Prober
from autofit.search._result import Fit, SearchReport, truncation_note, undominated
from autofit.search._speed_tie import SpeedJudge


class Choice:
    def __init__(self, spec: SearchSpec, grid: Grid, rungs: Sequence[Rung], prober: Prober, guide: MemoryGuide,
                 judge: SpeedJudge, report: SearchReport):
        self.spec, self.grid, self.rungs, self.prober, self.guide = spec, grid, rungs, prober, guide
        self.judge = judge  # ranks the fits and settles ties of measured speed
        self.report = report  # the choice is written into it: ``chosen`` and ``verified``

    def rank(self, fits: List[Fit]) -> List[Fit]:
        """The fits no other fit beats on every count, the best first."""
        return self.judge.rank(undominated(fits))

    def choose(self, primary: List[Fit], fallback: List[Fit]) -> bool:
        """Whether a fit held over its verification (then it is the report's ``chosen``)."""
        prober, report = self.prober, self.report
        primary, fallback = within_margin(primary, fallback, self.guide.fits, self.grid.size)
        ranked = self.rank(primary) + self.rank(fallback)
        if self._choose_over_margin(ranked[0] if ranked else None):
            return True
        for fit in self.judge.settle(ranked, lambda f: prober.measure(f.level, f.candidate, kind="verify")):
            verified = prober.measure(fit.level, fit.candidate, kind="verify")  # a tie's second: measured already
            if verified.fits:
                report.chosen, report.verified = fit, verified
                note = truncation_note(self.spec, fit.candidate)
                if note:
                    report.notes.append(note)
                return True
            report.notes.append(
                f"{fit.candidate.describe()} fitted in {self.spec.options.probe_steps} steps but not in "
                f"{self.spec.verify_plan()[0]} steps of verification ({verified.outcome.value}: "
                f"{clip(verified.error, 120)}); next candidate"
            )
        return False

    def _choose_over_margin(self, best: Optional[Fit]) -> bool:
        """A better fit the margin alone rejected is verified; the verification's evidence decides (``margin``)."""
        report = self.report
        budget, limit = self.spec.budget_bytes, self.guide.limit()
        order = [rung.name for rung in self.rungs]
        fit = best_margin_only_fit(report.records, best, self.grid.levels, order, budget, limit)
        if fit is None:
            return False
        verified = self.prober.measure(fit.level, fit.candidate, kind="verify")
        assert budget is not None  # a fit over the margin was measured against a budget
        kept, note = evidence(fit.result, verified, budget, limit)
        note = f"{fit.candidate.describe()} [{'+'.join(fit.candidate.rungs) or 'baseline'}] {note}"
        if note not in report.notes:
            report.notes.append(note)
        if kept:
            report.chosen, report.verified = fit, verified
            truncation = truncation_note(self.spec, fit.candidate)
            if truncation:
                report.notes.append(truncation)
        return kept
