"""A quantized, frozen base model (bitsandbytes 8-bit or 4-bit NF4) trained through LoRA adapters."""

from typing import Dict

from autofit.core import LoraSettings
from autofit.rungs._ladder import QUALITY, LadderState


class QuantizedBase:
    cost = QUALITY

    def __init__(self, bits: int):
        if bits not in (4, 8):
            raise ValueError(f"quantization bits {bits} not supported: accepted are 4 and 8")
        self.bits = bits
        self.name = f"quant-{bits}bit"
        self.help = "bitsandbytes " + ("int8 (LLM.int8)" if bits == 8 else "NF4 with double quantization") + " + LoRA"

    def apply(self, state: LadderState):
        current = state.candidate.quantization
        if current is not None and int(current[0]) <= self.bits:
            return None
        changes: Dict[str, object] = {"quantization": f"{self.bits}bit"}
        if state.candidate.lora is None:
            changes["lora"] = LoraSettings()
        return state.with_rung(self, candidate_changes=changes)
