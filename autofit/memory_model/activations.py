"""Activations saved for the backward pass, per token and decoder layer (memory-facts 2.4)."""

from __future__ import annotations

from typing import Optional, Tuple

from autofit.candidate import Candidate, LoraSettings
from autofit.memory_model.parameters import LORA_DROPOUT_BYTES_PER_ELEMENT, lora_targets
from autofit.memory_model.shape import ModelShape

# 2.4, Llama/Qwen (SwiGLU, RMSNorm, no dropout, GQA), HF modules, no checkpointing: bytes saved per token per layer
# at 2-byte activations ≈ c_h·h + 8·I + 4·h_kv, with c_h = 8 (fused norms) ... 16 (HF eager norms) [D].
# Split here so that models whose q width (heads·head_dim) differs from h (gemma3) and models with more norms
# are counted per tensor:
ACT_NORM_BYTES = 4  # per normalized element: 2 (fused) ... 6 (eager, fp32 upcast saved); prior = the middle
ACT_Q_AND_ATTN_OUT_BYTES = 4  # Q (2 B) + attention output (2 B), per q element (heads·head_dim)
ACT_KV_BYTES = 4  # K and V (2 B each), per kv element (kv_heads·head_dim)
ACT_MLP_BYTES = 8  # gate out, up out, act(gate), product: 4 tensors x 2 B, per intermediate element
# ⇒ for a qwen2/llama layer: 4·2h (two norms) + 4h + 4·h_kv + 8·I = c_h 12 (the prior's middle) [D].
# Outside the decoder layers, per token: embedding output, final norm, the hidden state handed to the LM head
# (a compact copy on CUDA) [A]: a few h.
ACT_OUTSIDE_LAYERS_BYTES_PER_H = 8
# A decoder layer's backward allocates gradient temporaries on top of the saved activations: about half a layer's
# saved activations [V: measured on the CPU meter, tiny-qwen2 reward model, 9 KB/token over 18 KB per layer].
BACKWARD_TEMP_LAYERS = 0.5
# 2.4, HF gradient checkpointing: keeps every layer's input (h per token per layer) plus, during the backward, one
# layer's full activations while it is recomputed plus that layer's backward temporaries [V concept].
CKPT_LIVE_LAYERS = 1 + BACKWARD_TEMP_LAYERS
# 2.4, eager (or SDPA math) attention materializes the scores: 5 B x heads x s² x batch per layer (Korthikanti's
# 5as²b, matched by ms-swift's measurement: 4.99 B per score element) [D from V]. SDPA flash/efficient: none.
EAGER_SCORE_BYTES = 5
# rl.py: synthetic prompts are ``prompt_length or 64`` tokens long.
DEFAULT_PROMPT_LENGTH = 64


def sequence_length(candidate: Candidate) -> int:
    """Tokens of one training sequence: RL trains on prompt + completion."""
    if candidate.is_rl:
        return (candidate.prompt_length or DEFAULT_PROMPT_LENGTH) + candidate.max_length
    return candidate.max_length


def sequences_per_micro_batch(candidate: Candidate) -> int:
    """The reward trainer concatenates the chosen and the rejected sides: 2 sequences per example."""
    return 2 * candidate.micro_batch if candidate.algo == "reward" else candidate.micro_batch


def train_tokens(candidate: Candidate) -> int:
    return sequences_per_micro_batch(candidate) * sequence_length(candidate)


def activation_bytes_per_token_layer(shape: ModelShape, act_bytes: int, lora: Optional[LoraSettings] = None) -> float:
    """Bytes saved for backward per token per decoder layer without checkpointing (memory-facts 2.4)."""
    scale = act_bytes / 2  # the coefficients are bytes at 2-byte activations
    norm_elems = shape.norms_per_layer * shape.hidden + (shape.q_dim + shape.kv_dim if shape.qk_norm else 0)
    per = (ACT_NORM_BYTES * norm_elems + ACT_Q_AND_ATTN_OUT_BYTES * shape.q_dim + ACT_KV_BYTES * shape.kv_dim
           + ACT_MLP_BYTES * shape.intermediate)
    if lora is not None and lora.dropout > 0:
        linears = shape.linear_shapes()
        inputs = sum(linears[n][0] for n in lora_targets(lora.target_modules))  # 6h + I for all-linear
        per += LORA_DROPOUT_BYTES_PER_ELEMENT * inputs
    return per * scale


def activation_bytes(candidate: Candidate, shape: ModelShape, act_bytes: int) -> Tuple[float, float]:
    """(bytes at the LM head's backward, bytes at a decoder layer's backward). Two moments of the forward/backward:
    the LM head's backward holds every saved activation (and the head's buffers, counted in ``logits``); a decoder
    layer's backward holds its gradient temporaries (with checkpointing, the recomputed layer too) once the head's
    buffers are gone."""
    tokens = train_tokens(candidate)
    per_layer = activation_bytes_per_token_layer(shape, act_bytes, candidate.lora)
    outside = ACT_OUTSIDE_LAYERS_BYTES_PER_H * shape.hidden * act_bytes / 2
    if candidate.checkpointing:
        saved = tokens * (shape.layers * shape.hidden * act_bytes + outside)
        layer_moment = saved + tokens * CKPT_LIVE_LAYERS * per_layer
    else:
        saved = tokens * (shape.layers * per_layer + outside)
        layer_moment = saved + tokens * BACKWARD_TEMP_LAYERS * per_layer
    if shape.eager_attention:
        seq = sequence_length(candidate)
        scores = EAGER_SCORE_BYTES * act_bytes / 2 * shape.heads * seq * seq * sequences_per_micro_batch(candidate)
        if candidate.checkpointing:
            layer_moment += scores  # only the recomputed layer's scores
        else:
            saved += scores * shape.layers
            layer_moment += scores * shape.layers
    return saved, layer_moment
