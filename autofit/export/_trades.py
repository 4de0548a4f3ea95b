"""What the user trades for the fit: one sentence per chosen rung (best.json ``trades``)."""

from __future__ import annotations

from typing import List, Optional

from autofit.core import Candidate
from autofit.memory_model import ModelShape, census_for, trainable_tensors

FIXED = {
    "expandable-segments": "PyTorch's expandable segments: less fragmentation, nothing traded",
    "liger-kernels": "Liger's fused RMSNorm, SwiGLU and RoPE kernels: the same math in other kernels (results equal to "
                     "rounding), nothing traded; TRL 1.16 warns that use_liger_kernel goes in v2",
    "micro-batch": "smaller micro-batches with more accumulation: the same effective batch, more steps of less work",
    "checkpointing": "activation checkpointing: the same math, the forward recomputed in the backward (about a third "
                     "more compute)",
    "activation-offload": "activation offloading: saved activations wait in host memory for the backward pass, the "
                          "same math; slower steps where the copies do not overlap the compute, and pinned host RAM",
    "optimizer-offload": "optimizer offload (DeepSpeed ZeRO-2): fp32 master weights, gradients and AdamW states in "
                         "host memory, the same math; slower steps and pinned host RAM",
    "bf16-weights": "pure bf16 training: weights, gradients and optimizer states in bfloat16, no float32 master "
                    "weights (small updates can round away)",
    "optimizer-8bit": "8-bit AdamW (bitsandbytes): both moments stored block-wise in 8 bits",
    "quant-8bit": "8-bit base weights (LLM.int8): the frozen weights are quantized, the adapters train on them",
    "quant-4bit": "4-bit base weights (NF4, double quantization): the frozen weights are quantized, the adapters "
                  "train in bf16 on their dequantized values",
}


def trades(candidate: Candidate, asked_length: int, shape=None) -> List[str]:
    """The quality cost of each rung of ``candidate``, in the order they were climbed. ``shape``: the model's
    ``ModelShape`` (LoRA's share of trained parameters), or None."""
    sentences = []
    for rung in candidate.rungs:
        if rung == "lora" and candidate.lora is not None:
            sentences.append(_lora(candidate, shape))
        elif rung == "shorter-length":
            sentences.append(f"sequences capped at {candidate.max_length} tokens instead of {asked_length}: longer "
                             "rows are truncated")
        elif rung in FIXED:
            sentences.append(FIXED[rung])
    return sentences


def _lora(candidate: Candidate, shape: Optional[ModelShape]) -> str:
    lora = candidate.lora
    assert lora is not None  # called for a candidate with LoRA only
    text = f"LoRA r={lora.r} (alpha {lora.alpha}) on {lora.target_modules}: the base model is frozen"
    if shape is None:
        return text
    trained = sum(t.numel * t.count for t in trainable_tensors(shape, candidate))
    total = census_for(shape, candidate.algo).total
    text += f", {trained:,} of {total:,} parameters trained ({trained / total:.2%})"
    if shape.moe_layers and census_for(shape, candidate.algo).lora_wrapped:
        text += "; peft adapts the fused experts through target_parameters"
    return text
