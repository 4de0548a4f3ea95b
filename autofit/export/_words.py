"""The export's words: what the user trades for the fit (best.json ``trades``, the notes) and the comment best.yaml
gives each key. Both are the rungs' own (``RungBase.trade``, ``RungBase.comment``), found by the names the candidate
climbed; what is not a rung's (the effective batch, a flag of the user's, the device) is said here, by config key.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from autofit.core import Candidate, vllm_installed
from autofit.memory_model import ModelShape, census_for, trainable_tensors
from autofit.rungs import rung_named

BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps")
CHECKPOINTING_KEYS = ("activation_checkpointing", "gradient_checkpointing")
LENGTH_KEYS = ("max_length", "max_completion_length")
VLLM_KEYS = ("use_vllm", "vllm_mode", "vllm_gpu_memory_utilization")
# Keys a rung may write that a candidate can carry without that rung: the user's own trainer adds them (measured)
OWN_LORA_KEYS = ("lora_", "use_peft")
OWN_QUANTIZATION_KEYS = ("load_in", "bnb_", "use_bnb")
FIXED_REASONS = {
    "attn_implementation": "the attention implementation the probes measured",
    "trust_remote_code": "--trust-remote-code: the model's own code runs",
    "model_name_or_path": "random weights were probed; memory does not depend on their values",
    "use_cpu": "CPU device (simulated meter)",
    "bf16": "CPU device (simulated meter)",
}


def trades(candidate: Candidate, asked_length: int, shape: Optional[ModelShape] = None) -> List[str]:
    """The quality cost of each rung of ``candidate``, in the order they were climbed, in the rung's words.
    ``shape``: the model's ``ModelShape`` (LoRA's share of trained parameters), or None."""
    context = trade_context(candidate, asked_length, shape)
    sentences = []
    for name in candidate.rungs:
        trade = getattr(rung_named(name), "trade", None)  # None: a rung autofit does not know, or one without words
        sentence = trade(candidate, context) if trade is not None else None
        if sentence:
            sentences.append(sentence)
    return sentences


def trade_context(candidate: Candidate, asked_length: int, shape: Optional[ModelShape]) -> Dict[str, Any]:
    """What a rung's sentence may need that the candidate does not carry: the asked length, and with adapters and a
    known model, the parameters they train (the memory model counts them)."""
    context: Dict[str, Any] = {"asked_length": asked_length}
    if candidate.lora is not None and shape is not None:
        census = census_for(shape, candidate.algo)
        context.update(trained_parameters=sum(t.numel * t.count for t in trainable_tensors(shape, candidate)),
                       total_parameters=census.total,
                       adapts_fused_experts=bool(shape.moe_layers and census.lora_wrapped))
    return context


def why(key: str, candidate: Candidate, asked_length: int, maximize: str) -> str:
    """best.yaml's comment on one exported key (``env.NAME`` for an environment variable): the reason it is not a
    rung's, else the first of the candidate's rungs that claims it, else the user's own."""
    return (_before_rungs(key, candidate, asked_length, maximize) or _rungs(key, candidate)
            or _after_rungs(key, candidate) or "yours")


def _before_rungs(key: str, candidate: Candidate, asked_length: int, maximize: str) -> Optional[str]:
    """Keys whose value no rung decided: the user's flags, the device, the length as asked."""
    if key in VLLM_KEYS:
        return "--use-vllm" + (" (vLLM was estimated, not probed: not installed where the search ran)"
                               if key == "use_vllm" and not vllm_installed() else "")
    if key in ("num_generations", "beta"):
        return f"--{key.replace('_', '-')}"
    if key in LENGTH_KEYS:
        if maximize == "length":
            return "longest that fits (--maximize length)"
        if candidate.max_length >= asked_length:
            return "--max-completion-length" if candidate.is_rl else "--max-length"
    return FIXED_REASONS.get(key)


def _rungs(key: str, candidate: Candidate) -> Optional[str]:
    for name in candidate.rungs:
        comment = getattr(rung_named(name), "comment", None)
        text = comment(key, candidate) if comment is not None else None
        if text:
            return text
    return None


def _after_rungs(key: str, candidate: Candidate) -> Optional[str]:
    """Keys no rung of the candidate claims that are not the user's either."""
    if key in BATCH_KEYS:
        return "effective batch"
    if key in CHECKPOINTING_KEYS and not candidate.checkpointing:
        return "baseline: off is fastest and fits"
    if key.startswith(OWN_LORA_KEYS):
        return "your trainer's own LoRA (measured)"
    if key.startswith(OWN_QUANTIZATION_KEYS):
        return "your trainer's own quantization (measured)"
    if key in ("dtype", "model_init_kwargs") and candidate.dtype is not None:
        return "--dtype"
    return None
