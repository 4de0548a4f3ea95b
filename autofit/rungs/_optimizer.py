"""8-bit AdamW (bitsandbytes): optimizer states in 2 bytes per parameter instead of 8."""

from autofit.rungs._ladder import QUALITY, LadderState

EIGHT_BIT_ADAMW = "adamw_bnb_8bit"


class EightBitOptimizer:
    name = "optimizer-8bit"
    cost = QUALITY
    help = f"optim={EIGHT_BIT_ADAMW}"

    def apply(self, state: LadderState):
        if state.candidate.optim == EIGHT_BIT_ADAMW:
            return None
        return state.with_rung(self, candidate_changes={"optim": EIGHT_BIT_ADAMW})
