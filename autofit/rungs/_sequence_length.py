"""Shorter sequences, the last resort: max_length may drop, never below the user's --min-length."""

from autofit.rungs._ladder import QUALITY, LadderState


class ShorterSequences:
    name = "shorter-length"
    cost = QUALITY
    help = "max_length lowered down to --min-length (longer examples are truncated)"

    def apply(self, state: LadderState):
        if state.vary_length or state.maximize == "length" or state.min_length >= state.candidate.max_length:
            return None
        return state.with_rung(self, vary_length=True)
