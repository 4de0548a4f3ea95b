"""A quantized, frozen base model (bitsandbytes 8-bit or 4-bit NF4) trained through LoRA adapters."""

from typing import Any, Dict, Mapping, Optional

from autofit.core import Candidate, LoraSettings
from autofit.rungs._contract import RungBase, knob
from autofit.rungs._ladder import QUALITY, LadderState

TRADES = {
    8: "8-bit base weights (LLM.int8): the frozen weights are quantized, the adapters train on them",
    4: "4-bit base weights (NF4, double quantization): the frozen weights are quantized, the adapters train in bf16 "
       "on their dequantized values",
}


class QuantizedBase(RungBase):
    cost = QUALITY
    modelled = True

    def __init__(self, bits: int):
        if bits not in (4, 8):
            raise ValueError(f"quantization bits {bits} not supported: accepted are 4 and 8")
        self.bits = bits
        self.name = f"quant-{bits}bit"
        self.help = "bitsandbytes " + ("int8 (LLM.int8)" if bits == 8 else "NF4 with double quantization") + " + LoRA"
        self.trade_text = TRADES[bits]

    def apply(self, state: LadderState):
        if self.bits == 8 and state.candidate.vllm == "colocate":
            return None  # TRL refuses it: "vLLM does not support in-flight 8-bit quantization." [S: trl/generation/
            # vllm_generation.py, VLLMGeneration]; 4-bit starts vLLM with quantization="bitsandbytes"
        current = state.candidate.quantization
        if current is not None and int(current[0]) <= self.bits:
            return None
        changes: Dict[str, object] = {"quantization": f"{self.bits}bit"}
        if state.candidate.lora is None:
            changes["lora"] = LoraSettings()
        return state.with_rung(self, candidate_changes=changes)

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        """Its trade where the base is quantized to its bits: a 4-bit level climbed the 8-bit rung too."""
        return self.trade_text if candidate.quantization == f"{self.bits}bit" else None

    def comment(self, key: str, candidate: Candidate) -> Optional[str]:
        """Its bitsandbytes keys where the base is quantized to its bits (the 4-bit level climbed the 8-bit rung
        too), and the LoRA it brings where no LoRA rung came before."""
        if knob("quantization").owns(key):
            return self.name if candidate.quantization == f"{self.bits}bit" else None
        return self.name if knob("lora").owns(key) else None
