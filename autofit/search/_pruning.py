"""No rung that buys nothing: once a fit is found at a quality level, the earlier rungs it may not need are dropped.

Rungs are cumulative, so the level that first fits carries every rung before it: LoRA arrives with the 8-bit
optimizer that did not fit on its own, although with LoRA the optimizer states are a rounding error. For each
earlier rung, the costliest first, the level is rebuilt from the ladder without it and searched; the fit is kept
when it still fits (a quality rung: fewer changes to the training are always cheaper) or, for a speed rung
(checkpointing), when it fits at the same micro-batch and length (the rung would only cost time, whatever one timed
step says) or is faster. A speed level whose last rung is an alternative to an earlier one
(activation offloading to checkpointing) is tried without that one the same way. Not pruned: the rung that made
the level fit, the micro-batch and allocator rungs (they only widen the search), bf16 weights under LoRA or a
quantized base (the adapters train in float32 whatever the base's dtype, so it costs the training nothing), and, in
the quality class, searches for the longest length or with shorter sequences (dropping a rung there trades one
quality cost for another).
"""

from __future__ import annotations

import logging
from typing import Callable, List, Optional, Sequence, Tuple

from autofit.rungs import FREE, FREE_UNDER_ADAPTERS, NEVER_DROPPED, QUALITY, SPEED, LadderState, Rung, climb
from autofit.search._result import Fit

log = logging.getLogger(__name__)

SearchLevel = Callable[[int, LadderState], List[Fit]]
Lookahead = Callable[[List[LadderState]], None]  # the levels the pass may search next, for probes side by side
Faster = Callable[[Fit, Fit], bool]  # whether the first fit is faster than the second


def droppable(state: LadderState, rungs: Sequence[Rung]) -> List[Rung]:
    """The rungs of ``state`` worth trying without, costliest (latest) first. At a speed level: the speed rungs before
    its last (checkpointing and activation offloading under optimizer offload, checkpointing under activation
    offloading, its ``alternative_to``)."""
    applied = [r for r in rungs if r.name in state.rungs]
    if state.cost == SPEED:
        return [r for r in reversed(applied[:-1]) if r.cost == SPEED and r.name not in NEVER_DROPPED]
    quality = [r for r in applied if r.cost == QUALITY]
    if not quality or state.vary_length or state.maximize == "length":
        return []
    adapters = state.candidate.lora is not None or state.candidate.quantization is not None
    earlier = [r for r in applied[: applied.index(quality[-1])]
               if r.cost in (SPEED, QUALITY) and r.name not in NEVER_DROPPED
               and not (adapters and r.name in FREE_UNDER_ADAPTERS)]
    return list(reversed(earlier))


def pruned_levels(state: LadderState, rungs: Sequence[Rung], start: LadderState) -> List[LadderState]:
    """The levels the pass searches after a fit at ``state`` where each rung it tries to drop is not needed: what
    probes side by side start while ``state`` is searched."""
    return _each_dropped(start, [r for r in rungs if r.name in state.rungs], droppable(state, rungs))


def _each_dropped(start: LadderState, kept: Sequence[Rung], drops: Sequence[Rung]) -> List[LadderState]:
    """The levels of ``kept`` without the first of ``drops``, then without the first two, and so on."""
    return [climb(start, [r for r in kept if r not in drops[:depth + 1]])[-1] for depth in range(len(drops))]


def drop_unneeded(fit: Fit, levels: List[LadderState], rungs: Sequence[Rung], start: LadderState,
                  search_level: SearchLevel, faster: Optional[Faster] = None, lookahead: Optional[Lookahead] = None
                  ) -> Tuple[Fit, List[str], List[Fit], List[str]]:
    """The cheapest fit without rungs ``fit`` does not need, the names dropped, every other fit found on the way
    (fallbacks, should the best fail its verification), and why each speed rung was dropped or kept.
    Rebuilt levels are appended to ``levels`` (their index is the fit's level)."""
    state = levels[fit.level]
    kept = [r for r in rungs if r.name in state.rungs]
    best, dropped, others = fit, [], []
    reasons: List[str] = []
    drops = droppable(state, rungs)
    for position, rung in enumerate(drops):
        trial = [r for r in kept if r is not rung]
        rebuilt = climb(start, trial)[-1]
        if rung.name in rebuilt.rungs or rebuilt.candidate.replace(rungs=()) == levels[best.level].candidate.replace(
                rungs=()):
            continue  # another rung brings it back (a quantized base adds LoRA): nothing to drop
        index = next((i for i, s in enumerate(levels) if s.rungs == rebuilt.rungs), None)
        if index is None:
            levels.append(rebuilt)
            index = len(levels) - 1
        if lookahead is not None:  # the next rungs' levels, each dropped as this one may be (or this one kept)
            chain, later = _each_dropped(start, trial, drops[position + 1:]), drops[position + 1:position + 2]
            lookahead(chain[:1] + _each_dropped(start, kept, later) + chain[1:])
        fits = search_level(index, rebuilt)
        if not fits:
            continue
        if rung.cost == SPEED and not _better(fits[0], best, state.maximize, faster):
            others.extend(fits)
            reasons.append(f"{rung.name} kept: without it {fits[0].candidate.describe()} fits at "
                           f"{fits[0].result.tokens_per_second:,.0f} tok/s, with it {best.candidate.describe()} "
                           f"at {best.result.tokens_per_second:,.0f} tok/s")
            continue  # it fits without the rung, but smaller and no faster
        log.info("drop %s: %s fits without it", rung.name, fits[0].candidate.describe())
        if rung.cost == SPEED and as_large(fits[0], best):
            reasons.append(f"{rung.name} would only cost time: {fits[0].candidate.describe()} fits without it at "
                           "the same micro-batch and length")
        others.extend(fits[1:] + ([best] if best is not fit else []))
        best, kept = fits[0], trial
        dropped.append(rung.name)
    return best, dropped, others, reasons


def _better(fit: Fit, than: Fit, maximize: str, faster: Optional[Faster] = None) -> bool:
    """Without a speed rung, a fit replaces the one with it when it is as large (micro-batch and length): the rung
    bought nothing and only recomputes or moves memory, whatever one timed step says (``undominated``); else when
    faster (when the length is maximized: longer, or as long and faster)."""
    if maximize == "length" and fit.candidate.max_length != than.candidate.max_length:
        return fit.candidate.max_length > than.candidate.max_length
    if as_large(fit, than):
        return True
    if faster is not None:  # measured, or the throughput model where the timings tie (``_speed_tie``)
        return faster(fit, than)
    return fit.result.tokens_per_second > than.result.tokens_per_second


def as_large(fit: Fit, than: Fit) -> bool:
    return (fit.candidate.micro_batch >= than.candidate.micro_batch
            and fit.candidate.max_length >= than.candidate.max_length)


def prune(primary: List[Fit], fallback: List[Fit], cost: str, levels: List[LadderState], rungs: Sequence[Rung],
          start: LadderState, search_level: SearchLevel, faster: Optional[Faster] = None,
          lookahead: Optional[Lookahead] = None) -> Tuple[List[Fit], List[Fit], List[str]]:
    """The walk's fits of one cost class after pruning, the fallbacks, and a note per rung dropped. A quality class
    prunes its first fit; a speed class each fit whose level's last rung has an alternative."""
    if cost == FREE:
        return primary, fallback, []
    notes: List[str] = []
    targets = [0] if cost == QUALITY else [i for i, fit in enumerate(primary)
                                           if levels[fit.level].cost == SPEED and droppable(levels[fit.level], rungs)]
    pruned, extra = list(primary), []
    for index in targets:
        fit = primary[index]
        best, dropped, others, reasons = drop_unneeded(fit, levels, rungs, start, search_level, faster, lookahead)
        extra.extend(others)
        notes.extend(reasons)
        if dropped:
            notes.append(f"{', '.join(dropped)} dropped: {best.candidate.describe()} fits without "
                         + ("it" if len(dropped) == 1 else "them") + f" (the level that first fitted: "
                         f"{fit.candidate.describe()})")
            pruned[index] = best
            extra.append(fit)
    if cost == QUALITY and pruned[0] is not primary[0]:  # the quality class answers with its pruned fit alone
        return [pruned[0]], extra[:-1] + primary + fallback, notes
    return pruned, extra + fallback, notes
