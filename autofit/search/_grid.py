"""The search's grid: the ladder's levels, each level's candidate at a micro-batch and a length, the order of size the
walk searches in, and the cost class a level competes in. The walk, the read-ahead, the refinement and the choice
all place candidates on it; it measures nothing."""

from __future__ import annotations

from typing import List, Tuple

from autofit.core import Candidate, SearchSpec
from autofit.rungs import FREE, SPEED, FailedRungs, LadderState
from autofit.search._result import Fit


class Grid:
    def __init__(self, spec: SearchSpec, levels: List[LadderState], ladder_len: int, failed_rungs: FailedRungs):
        self.spec = spec
        self.levels = levels  # the ladder's, then those rebuilt without a rung (``autofit.search._pruning``)
        self.ladder_len = ladder_len
        self.failed_rungs = failed_rungs  # a rung whose machinery could not run here is left out of what is placed

    def at(self, state: LadderState, batch: int, length: int) -> Candidate:
        """The level's candidate at micro-batch ``batch`` and ``length``."""
        per_rank = state.per_rank(self.spec.rank_batch)
        candidate = state.candidate.replace(micro_batch=batch, grad_accum=per_rank // batch, max_length=length)
        return self.failed_rungs.runnable(candidate)

    def size(self, candidate: Candidate) -> Tuple[int, int]:
        """The key the walk orders fits by: (micro-batch, length), or (length, micro-batch) when the length is
        maximized."""
        size = candidate.micro_batch, candidate.max_length
        return size[::-1] if self.spec.options.maximize == "length" else size

    def cost_class(self, state: LadderState) -> str:
        """The cost class a level competes in (when the length is maximized, free and speed rungs compete together)."""
        return SPEED if self.spec.options.maximize == "length" and state.cost == FREE else state.cost

    def at_top(self, fit: Fit) -> bool:
        """Whether ``fit`` reaches the top of its level's range: the largest micro-batch (or the full length)."""
        if self.spec.options.maximize == "length":
            return fit.candidate.max_length == self.spec.max_length
        state = self.levels[fit.level]
        largest = state.per_rank(self.spec.rank_batch) if state.vary_batch else state.candidate.micro_batch
        return fit.candidate.micro_batch == largest and fit.candidate.max_length == self.spec.max_length
