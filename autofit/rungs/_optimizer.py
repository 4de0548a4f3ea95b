"""8-bit AdamW (bitsandbytes): optimizer states in 2 bytes per parameter instead of 8."""

from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import QUALITY, LadderState

EIGHT_BIT_ADAMW = "adamw_bnb_8bit"


class EightBitOptimizer(RungBase):
    name = "optimizer-8bit"
    cost = QUALITY
    modelled = True
    help = f"optim={EIGHT_BIT_ADAMW}"
    trade_text = "8-bit AdamW (bitsandbytes): both moments stored block-wise in 8 bits"
    knobs = ("optim",)
    knob_comment = "optimizer-8bit"

    def apply(self, state: LadderState):
        if state.candidate.optim == EIGHT_BIT_ADAMW:
            return None
        return state.with_rung(self, candidate_changes={"optim": EIGHT_BIT_ADAMW})
