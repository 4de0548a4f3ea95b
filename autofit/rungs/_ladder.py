"""The ladder: an ordered list of rungs, each a memory optimization the search may climb to.

A rung is a small object with a ``name``, a ``cost`` class and ``apply(state) -> state | None`` (None when it
does not apply). Rungs are cumulative: each level of the ladder is the previous level with one more rung applied.
The rungs themselves live beside it, one module per optimization; ``autofit.rungs._default`` has the default order
and ``resolve_ladder`` (rungs by name).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from autofit.core import Candidate

log = logging.getLogger(__name__)

# Cost classes, from free to costly.
FREE = "free"  # same math, same speed or faster
SPEED = "speed"  # same math, slower
QUALITY = "quality"  # different training
COSTS = (FREE, SPEED, QUALITY)
OFFLOAD_RUNG = "optimizer-offload"  # autofit.rungs._offload: taken off again by the quality rungs
# Rungs a fit is never tried without (they only widen the search), and one that costs nothing under adapters (they
# train in float32 whatever the base's dtype): autofit.search._pruning and the estimate's expected configuration.
NEVER_DROPPED = ("micro-batch", "expandable-segments")
FREE_UNDER_ADAPTERS = ("bf16-weights",)
# autofit.rungs._sharding's offloading variants: the quality rungs shrink the level with the shards on the GPU
SHARDS_BACK_ON_GPU = {"zero3-offload": "zero3", "fsdp2-offload": "fsdp2"}


@dataclass(frozen=True)
class LadderState:
    """One level of the ladder: a candidate template plus which knobs the search may still turn."""

    candidate: Candidate  # micro_batch and max_length are the search's starting point, not final
    cost: str = FREE
    vary_batch: bool = False  # micro-batch may shrink below the effective batch (with accumulation)
    vary_length: bool = False  # max_length may shrink down to the user's floor
    min_length: int = 0
    maximize: str = "batch"  # "batch" or "length"

    def with_rung(self, rung: Rung, **state_changes) -> LadderState:
        candidate_changes = state_changes.pop("candidate_changes", {})
        candidate = self.candidate
        if rung.cost == QUALITY and candidate.offload:  # quality rungs shrink the level without optimizer offload
            candidate = candidate.replace(offload=None, rungs=tuple(r for r in candidate.rungs if r != OFFLOAD_RUNG))
        if rung.cost == QUALITY and candidate.sharding in SHARDS_BACK_ON_GPU:
            candidate = candidate.replace(sharding=SHARDS_BACK_ON_GPU[candidate.sharding],
                                          rungs=tuple(r for r in candidate.rungs if r != candidate.sharding))
        return dataclasses.replace(
            self,
            candidate=candidate.with_rung(rung.name, **candidate_changes),
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

    # Optional: ``unavailable(device) -> str | None``, why the rung cannot be probed on this machine.


def climb(base: LadderState, rungs: Sequence[Rung]) -> List[LadderState]:
    """The levels of the ladder, base first; rungs that do not apply are skipped."""
    levels = [base]
    for rung in rungs:
        nxt = rung.apply(levels[-1])
        if nxt is not None:
            levels.append(nxt)
    return levels


def _own_engine(candidate: Candidate) -> Optional[str]:
    """The engine configuration the user's own file gives (DeepSpeed or FSDP), in words, or None."""
    args = dict(candidate.user_args)
    if (candidate.sharding or candidate.offload) and not candidate.rungs:  # the launch's (accelerate_config:, fsdp:)
        return f"engine ({candidate.sharding or candidate.offload})"
    if args.get("deepspeed"):
        return "DeepSpeed configuration (deepspeed:)"
    if args.get("fsdp") or args.get("fsdp_config"):
        return "FSDP configuration (fsdp:)"
    return None


def usable_rungs(rungs: Sequence[Rung], device: str, start: Optional[LadderState] = None
                 ) -> Tuple[List[Rung], List[str]]:
    """The rungs this machine can probe, and a note for each one left out (a rung may say why it cannot run). With
    ``start``, a rung that applies to no level climbed from it (sharding on one GPU) is not checked."""
    applied = None
    if start is not None:
        applied = {name for level in climb(start, rungs) for name in level.rungs}
    usable: List[Rung] = []
    left_out: Dict[str, List[str]] = {}  # reason -> the rungs it leaves out
    own_engine = _own_engine(start.candidate) if start is not None else None
    for rung in rungs:
        if applied is not None and rung.name not in applied:
            usable.append(rung)  # it never applies here: nothing to check, nothing to say
            continue
        reason = rung.unavailable(device) if hasattr(rung, "unavailable") else None
        if reason is None and own_engine and getattr(rung, "runs_an_engine", False):
            reason = f"your config runs its own {own_engine}, which autofit's engine would replace"
        if reason:
            left_out.setdefault(reason, []).append(rung.name)
        else:
            usable.append(rung)
    notes = [f"rung{'s' if len(names) > 1 else ''} {', '.join(names)} left out: {reason}"
             for reason, names in left_out.items()]
    for note in notes:
        log.info("%s", note)
    return usable, notes
