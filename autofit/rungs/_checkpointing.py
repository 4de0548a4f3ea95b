"""Activation (gradient) checkpointing: recompute layer activations in the backward pass."""

from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import SPEED, LadderState


class GradientCheckpointing(RungBase):
    name = "checkpointing"
    cost = SPEED
    modelled = True
    help = "activation_checkpointing=True (gradient_checkpointing before transformers 5.23)"
    trade_text = ("activation checkpointing: the same math, the forward recomputed in the backward (about a third "
                  "more compute)")
    knobs = ("checkpointing",)

    def apply(self, state: LadderState):
        if state.candidate.checkpointing:
            return None
        return state.with_rung(self, candidate_changes={"checkpointing": True})
