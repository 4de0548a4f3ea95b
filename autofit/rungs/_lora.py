"""LoRA adapters on every linear layer: only the adapters are trained (no full-size gradients or states)."""

from typing import Any, Mapping, Optional

from autofit.core import Candidate, LoraSettings
from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import QUALITY, LadderState


class Lora(RungBase):
    name = "lora"
    cost = QUALITY
    modelled = True
    help = "peft LoRA r=16, alpha=32, all linear layers"
    knobs = ("lora",)

    def __init__(self, settings: LoraSettings = LoraSettings()):
        self.settings = settings

    def apply(self, state: LadderState):
        if state.candidate.lora is not None:
            return None
        return state.with_rung(self, candidate_changes={"lora": self.settings})

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        """``context``: ``trained_parameters`` and ``total_parameters`` (the export counts them with the memory
        model), ``adapts_fused_experts`` (peft reaches an MoE's fused experts through ``target_parameters``)."""
        lora = candidate.lora
        if lora is None:
            return None
        text = f"LoRA r={lora.r} (alpha {lora.alpha}) on {lora.target_modules}: the base model is frozen"
        trained, total = context.get("trained_parameters"), context.get("total_parameters")
        if trained is None or total is None:
            return text
        text += f", {trained:,} of {total:,} parameters trained ({trained / total:.2%})"
        if context.get("adapts_fused_experts"):
            text += "; peft adapts the fused experts through target_parameters"
        return text
