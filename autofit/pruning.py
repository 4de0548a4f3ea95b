"""No rung that buys nothing: once a fit is found at a quality level, the earlier rungs it may not need are dropped.

Rungs are cumulative, so the level that first fits carries every rung before it: LoRA arrives with the 8-bit
optimizer that did not fit on its own, although with LoRA the optimizer states are a rounding error. For each
earlier rung, the costliest first, the level is rebuilt from the ladder without it and searched; the fit is kept
when it still fits (a quality rung: fewer changes to the training are always cheaper) or, for a speed rung
(checkpointing), when it fits and is faster. Not pruned: the rung that made the level fit, the micro-batch and
allocator rungs (they only widen the search), bf16 weights under LoRA or a quantized base (the adapters train in
float32 whatever the base's dtype, so it costs the training nothing), and searches for the longest length or with
shorter sequences (dropping a rung there trades one quality cost for another).
"""

from __future__ import annotations

import logging
from typing import Callable, List, Sequence, Tuple

from autofit.ladder import QUALITY, SPEED, LadderState, Rung, climb
from autofit.report import Fit

log = logging.getLogger(__name__)

SearchLevel = Callable[[int, LadderState], List[Fit]]
NEVER_DROPPED = ("micro-batch", "expandable-segments")
FREE_UNDER_ADAPTERS = ("bf16-weights",)


def droppable(state: LadderState, rungs: Sequence[Rung]) -> List[Rung]:
    """The rungs of ``state`` worth trying without, costliest (latest) first."""
    applied = [r for r in rungs if r.name in state.rungs]
    quality = [r for r in applied if r.cost == QUALITY]
    if not quality or state.vary_length or state.maximize == "length":
        return []
    adapters = state.candidate.lora is not None or state.candidate.quantization is not None
    earlier = [r for r in applied[: applied.index(quality[-1])]
               if r.cost in (SPEED, QUALITY) and r.name not in NEVER_DROPPED
               and not (adapters and r.name in FREE_UNDER_ADAPTERS)]
    return list(reversed(earlier))


def drop_unneeded(fit: Fit, levels: List[LadderState], rungs: Sequence[Rung], start: LadderState,
                  search_level: SearchLevel) -> Tuple[Fit, List[str], List[Fit]]:
    """The cheapest fit without rungs ``fit`` does not need, the names dropped, and every other fit found on the
    way (fallbacks, should the best fail its verification). Rebuilt levels are appended to ``levels`` (their index
    is the fit's level)."""
    state = levels[fit.level]
    kept = [r for r in rungs if r.name in state.rungs]
    best, dropped, others = fit, [], []
    for rung in droppable(state, rungs):
        trial = [r for r in kept if r is not rung]
        rebuilt = climb(start, trial)[-1]
        if rung.name in rebuilt.rungs or rebuilt.candidate.replace(rungs=()) == levels[best.level].candidate.replace(
                rungs=()):
            continue  # another rung brings it back (a quantized base adds LoRA): nothing to drop
        index = next((i for i, s in enumerate(levels) if s.rungs == rebuilt.rungs), None)
        if index is None:
            levels.append(rebuilt)
            index = len(levels) - 1
        fits = search_level(index, rebuilt)
        if not fits:
            continue
        if rung.cost == SPEED and fits[0].result.tokens_per_second <= best.result.tokens_per_second:
            others.extend(fits)
            continue  # it fits without recomputation, but no faster
        log.info("drop %s: %s fits without it", rung.name, fits[0].candidate.describe())
        others.extend(fits[1:] + ([best] if best is not fit else []))
        best, kept = fits[0], trial
        dropped.append(rung.name)
    return best, dropped, others
