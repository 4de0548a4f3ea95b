"""The choice among the fits the walk found, verified: the best fit by the cost class, speed and size
(``Search._rank``), a better fit the margin alone rejected verified first (``autofit.search._margin``), a tie of
measured speed settled (``autofit.search._speed_tie``), and the next-best one verified where the first does not hold
over the longer verification run."""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from autofit.core import clip
from autofit.search._margin import best_margin_only_fit, evidence, within_margin
from autofit.search._result import Fit, truncation_note

if TYPE_CHECKING:
    from autofit.search._search import Search


def _choose_over_margin(search: Search, best: Optional[Fit]) -> bool:
    """A better fit the margin alone rejected is verified; the verification's evidence decides (``margin``)."""
    budget, limit = search.spec.budget_bytes, search.guide.limit()
    order = [rung.name for rung in search.rungs]
    fit = best_margin_only_fit(search.report.records, best, search.levels, order, budget, limit)
    if fit is None:
        return False
    verified = search._measure(fit.level, fit.candidate, kind="verify")
    assert budget is not None  # a fit over the margin was measured against a budget
    kept, note = evidence(fit.result, verified, budget, limit)
    note = f"{fit.candidate.describe()} [{'+'.join(fit.candidate.rungs) or 'baseline'}] {note}"
    if note not in search.report.notes:
        search.report.notes.append(note)
    if kept:
        search.report.chosen, search.report.verified = fit, verified
        truncation = truncation_note(search.spec, fit.candidate)
        if truncation:
            search.report.notes.append(truncation)
    return kept

def choose(search: Search, primary: List[Fit], fallback: List[Fit]) -> bool:
    primary, fallback = within_margin(primary, fallback, search.guide.fits, search._size)
    ranked = search._rank(primary) + search._rank(fallback)
    if _choose_over_margin(search, ranked[0] if ranked else None):
        return True
    for fit in search.judge.settle(ranked, lambda f: search._measure(f.level, f.candidate, kind="verify")):
        verified = search._measure(fit.level, fit.candidate, kind="verify")  # a tie's second: measured already
        if verified.fits:
            search.report.chosen, search.report.verified = fit, verified
            note = truncation_note(search.spec, fit.candidate)
            if note:
                search.report.notes.append(note)
            return True
        search.report.notes.append(
            f"{fit.candidate.describe()} fitted in {search.spec.options.probe_steps} steps but not in "
            f"{search.spec.verify_plan()[0]} steps of verification ({verified.outcome.value}: "
            f"{clip(verified.error, 120)}); next candidate"
        )
    return False
