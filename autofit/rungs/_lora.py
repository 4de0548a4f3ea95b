"""LoRA adapters on every linear layer: only the adapters are trained (no full-size gradients or states)."""

from autofit.core import LoraSettings
from autofit.rungs._ladder import QUALITY, LadderState


class Lora:
    name = "lora"
    cost = QUALITY
    help = "peft LoRA r=16, alpha=32, all linear layers"

    def __init__(self, settings: LoraSettings = LoraSettings()):
        self.settings = settings

    def apply(self, state: LadderState):
        if state.candidate.lora is not None:
            return None
        return state.with_rung(self, candidate_changes={"lora": self.settings})
