"""Activation (gradient) checkpointing: recompute layer activations in the backward pass."""

from autofit.ladder import SPEED, LadderState


class GradientCheckpointing:
    name = "checkpointing"
    cost = SPEED
    # transformers 5 renamed the field; setting only gradient_checkpointing can silently keep it on.
    help = "activation_checkpointing=True"

    def apply(self, state: LadderState):
        if state.candidate.checkpointing:
            return None
        return state.with_rung(self, candidate_changes={"checkpointing": True})
