"""Shorter sequences, the last resort: max_length may drop, never below the user's --min-length."""

from typing import Any, Mapping, Optional

from autofit.core import Candidate
from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import QUALITY, LadderState


class ShorterSequences(RungBase):
    name = "shorter-length"
    cost = QUALITY
    modelled = True
    help = "max_length lowered down to --min-length (longer examples are truncated)"
    knobs = ("length",)
    knob_comment = "shorter-length"
    priced_by_its_search = "the search then varies the length from the level's full length down"

    def apply(self, state: LadderState):
        if state.vary_length or state.maximize == "length" or state.min_length >= state.candidate.max_length:
            return None
        return state.with_rung(self, vary_length=True)

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        """``context``: ``asked_length``, the length the user asked for."""
        asked = context.get("asked_length")
        return (f"sequences capped at {candidate.max_length} tokens" + (f" instead of {asked}" if asked else "")
                + ": longer rows are truncated")
