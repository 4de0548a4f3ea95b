"""PyTorch's expandable segments: one growing segment per stream instead of fixed blocks, less fragmentation."""

from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import FREE, LadderState

ALLOC_ENV = "PYTORCH_ALLOC_CONF"


class ExpandableSegments(RungBase):
    name = "expandable-segments"
    cost = FREE
    help = f"{ALLOC_ENV}=expandable_segments:True (CUDA only)"
    trade_text = "PyTorch's expandable segments: less fragmentation, nothing traded"
    key_comments = {f"env.{ALLOC_ENV}": "expandable-segments"}

    def apply(self, state: LadderState):
        candidate = state.candidate
        if candidate.device != "cuda" or ALLOC_ENV in dict(candidate.env):
            return None
        env = tuple(sorted(dict(candidate.env, **{ALLOC_ENV: "expandable_segments:True"}).items()))
        return state.with_rung(self, candidate_changes={"env": env})
