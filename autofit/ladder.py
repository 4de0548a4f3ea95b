"""The ladder: an ordered list of rungs, each a memory optimization the search may climb to.

A rung is a small object with a ``name``, a ``cost`` class and ``apply(state) -> state | None`` (None when it
does not apply). Rungs are cumulative: each level of the ladder is the previous level with one more rung applied.
The rungs themselves live in the top-level ``strategies`` package, one module per optimization, which also has the
default order and ``resolve_ladder`` (rungs by name): this module never imports it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Protocol, Sequence

from autofit.candidate import Candidate

# Cost classes, from free to costly.
FREE = "free"  # same math, same speed or faster
SPEED = "speed"  # same math, slower
QUALITY = "quality"  # different training
COSTS = (FREE, SPEED, QUALITY)


@dataclass(frozen=True)
class LadderState:
    """One level of the ladder: a candidate template plus which knobs the search may still turn."""

    candidate: Candidate  # micro_batch and max_length are the search's starting point, not final
    cost: str = FREE
    vary_batch: bool = False  # micro-batch may shrink below the effective batch (with accumulation)
    vary_length: bool = False  # max_length may shrink down to the user's floor
    min_length: int = 0
    maximize: str = "batch"  # "batch" or "length"

    def with_rung(self, rung: "Rung", **state_changes) -> "LadderState":
        candidate_changes = state_changes.pop("candidate_changes", {})
        return dataclasses.replace(
            self,
            candidate=self.candidate.with_rung(rung.name, **candidate_changes),
            cost=max(self.cost, rung.cost, key=COSTS.index),
            **state_changes,
        )

    @property
    def rungs(self):
        return self.candidate.rungs


class Rung(Protocol):
    name: str
    cost: str
    help: str

    def apply(self, state: LadderState) -> Optional[LadderState]: ...


def climb(base: LadderState, rungs: Sequence[Rung]) -> List[LadderState]:
    """The levels of the ladder, base first; rungs that do not apply are skipped."""
    levels = [base]
    for rung in rungs:
        nxt = rung.apply(levels[-1])
        if nxt is not None:
            levels.append(nxt)
    return levels
