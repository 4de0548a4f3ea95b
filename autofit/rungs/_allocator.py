"""PyTorch's expandable segments: one growing segment per stream instead of fixed blocks, less fragmentation; and the
caching allocator's options as the process sees them: ``PYTORCH_ALLOC_CONF``, or, where it is unset, the older
``PYTORCH_CUDA_ALLOC_CONF`` that most launch files still carry (torch reads both; the newer wins, they are not merged).
"""

from typing import Mapping

from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import FREE, LadderState

ALLOC_ENV = "PYTORCH_ALLOC_CONF"
LEGACY_ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def allocator_options(env: Mapping[str, str]) -> str:
    """The allocator options in effect for ``env`` ("" where none are set)."""
    return str(env.get(ALLOC_ENV, env.get(LEGACY_ALLOC_ENV, "")))


class ExpandableSegments(RungBase):
    name = "expandable-segments"
    cost = FREE
    modelled = True
    help = f"{ALLOC_ENV}=expandable_segments:True (CUDA only)"
    trade_text = "PyTorch's expandable segments: less fragmentation, nothing traded"
    key_comments = {f"env.{ALLOC_ENV}": "expandable-segments"}

    def apply(self, state: LadderState):
        candidate = state.candidate
        given = allocator_options(dict(candidate.env))  # the user's env: block's, kept where the rung is not chosen
        if candidate.device != "cuda" or "expandable_segments:True" in given or "backend:cudaMallocAsync" in given:
            return None  # already on, or CUDA's own allocator, which has no expandable segments
        kept = [part for part in given.split(",") if part and not part.startswith("expandable_segments:")]
        # the rung's key wins, written to the name torch reads first; the user's other options (under either name) stay
        value = ",".join(kept + ["expandable_segments:True"])
        env = tuple(sorted(dict(candidate.env, **{ALLOC_ENV: value}).items()))
        return state.with_rung(self, candidate_changes={"env": env})
