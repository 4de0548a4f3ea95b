"""Activation (gradient) checkpointing: recompute layer activations in the backward pass."""

from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import SPEED, LadderState


class GradientCheckpointing(RungBase):
    name = "checkpointing"
    cost = SPEED
    # transformers 5.23 renamed the field; setting only gradient_checkpointing there can silently keep it on, so the
    # candidate writes whichever name the installed transformers has (autofit.core._compat).
    help = "activation_checkpointing=True (gradient_checkpointing before transformers 5.23)"
    trade_text = ("activation checkpointing: the same math, the forward recomputed in the backward (about a third "
                  "more compute)")
    key_comments = dict.fromkeys(("activation_checkpointing", "gradient_checkpointing"), "checkpointing")

    def apply(self, state: LadderState):
        if state.candidate.checkpointing:
            return None
        return state.with_rung(self, candidate_changes={"checkpointing": True})
