"""Headroom from evidence: a fit rejected only by the margin gets a verification, and the verification decides.

The margin (3% of the card on CUDA, more when the memory model's measured error is larger) guards against what a
2-step probe cannot see: drift over more steps, allocator fragmentation. On an H100 it rejected a full fine-tune
that fitted at 77.32 of 79.65 GiB, 60 MB inside the margin, and the answer fell to LoRA; the fit, verified by
hand, held. So a fit within the budget but not the margin, and better than the chosen one (a cheaper cost class,
fewer quality rungs, or faster in the same level), is verified first, and kept when the verification shows the
evidence a short probe lacks:

- the verification (``--verify-steps``, 3 to 10 steps) fits the whole budget;
- its peak, grown once more by the drift it showed over the probe's, still fits the budget;
- the caching allocator did not have to free its cache and retry an allocation (``num_alloc_retries``, CUDA).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

from autofit.core import Candidate, ProbeResult, format_size
from autofit.rungs import COSTS, QUALITY, LadderState
from autofit.search._result import Fit, Record


def within_margin(primary: List[Fit], fallback: List[Fit], fits: Callable[[ProbeResult], bool],
                  size: Callable[[Candidate], Tuple[int, int]]) -> Tuple[List[Fit], List[Fit]]:
    """Drop fits the final margin rejects (it grows with the model's measured error during the search); a level
    whose best fit is dropped is represented by its largest remaining one."""
    kept = [f for f in primary if fits(f.result)]
    spare = [f for f in fallback if fits(f.result)]
    for dropped in (f for f in primary if f not in kept):
        same_level = [f for f in spare if f.level == dropped.level]
        if same_level:
            promoted = max(same_level, key=lambda f: size(f.candidate))
            kept.append(promoted)
            spare.remove(promoted)
    return kept, spare


def over_margin(result: ProbeResult, budget: Optional[int], limit: float) -> Optional[float]:
    """Bytes by which a probe that fitted the budget missed the margin; None when it did not fit, or fitted both."""
    if budget is None or not result.fits or result.peak_bytes > budget or result.peak_bytes <= limit:
        return None
    return result.peak_bytes - limit


def _costliest(rungs: Sequence[str], order: Sequence[str]) -> int:
    """The ladder position of the costliest rung (a quality level is as costly as its latest rung)."""
    return max((order.index(r) for r in rungs if r in order), default=-1)


def _rank_key(fit: Fit, levels: Sequence[LadderState], order: Sequence[str]) -> Tuple[int, int, int, float]:
    state = levels[fit.level]
    quality = state.cost == QUALITY
    return (COSTS.index(state.cost), _costliest(state.rungs, order) if quality else 0,
            len(state.rungs) if quality else 0, -fit.result.tokens_per_second)


def best_margin_only_fit(records: Sequence[Record], best: Optional[Fit], levels: Sequence[LadderState],
                         order: Sequence[str], budget: Optional[int], limit: float) -> Optional[Fit]:
    """The probe that fitted the budget but not the margin and beats ``best``: a cheaper cost class, then (quality)
    an earlier costliest rung in the ladder's order and fewer rungs, then more throughput. One, because each costs
    a verification."""
    found = [Fit(r.level, r.candidate, r.result) for r in records
             if r.kind == "probe" and over_margin(r.result, budget, limit) is not None]
    def key(fit: Fit) -> Tuple[int, int, int, float]:
        return _rank_key(fit, levels, order)

    found = [fit for fit in found if best is None or key(fit) < key(best)]
    return min(found, key=key) if found else None


def evidence(probe: ProbeResult, verified: ProbeResult, budget: int, limit: float) -> Tuple[bool, str]:
    """Whether the verification supports keeping a fit the margin rejected, and the note that says why."""
    over = format_size(probe.peak_bytes - limit)
    head = (f"fitted {format_size(probe.peak_bytes)} of {format_size(budget)} but not the margin "
            f"(over it by {over})")
    if not verified.fits or verified.peak_bytes > budget:
        return False, f"{head}; its verification did not fit ({verified.outcome.value}): rejected"
    drift = max(0, verified.peak_bytes - probe.peak_bytes)
    retries = int(verified.stats.get("alloc_retries", 0) or 0)
    grown = verified.peak_bytes + drift
    facts = (f"verified over {verified.steps} steps at {format_size(verified.peak_bytes)}, drift "
             f"{format_size(drift)}, {retries} allocator retries")
    if retries:
        return False, f"{head}; {facts}: the allocator is already short, rejected"
    if grown > budget:
        return False, f"{head}; {facts}: with that drift once more it would reach {format_size(grown)}, rejected"
    return True, f"{head}; {facts}: kept on that evidence"
