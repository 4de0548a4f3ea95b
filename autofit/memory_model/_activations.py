"""Activations saved for the backward pass, per token and decoder layer (memory-facts 2.4)."""

from __future__ import annotations

from typing import Optional, Tuple

from autofit.core import DEFAULT_ALGO, Candidate, LoraSettings
from autofit.memory_model._activation_policy import activation_policy
from autofit.memory_model._census import lora_inputs_per_layer
from autofit.memory_model._parameters import LORA_DROPOUT_BYTES_PER_ELEMENT, census_for
from autofit.memory_model._shape import ModelShape

# 2.4, Llama/Qwen (SwiGLU, RMSNorm, no dropout, GQA), HF modules, no checkpointing: bytes saved per token per layer
# at 2-byte activations ≈ c_h·h + 8·I + 4·h_kv, with c_h = 8 (fused norms) ... 16 (HF eager norms) [D].
# Split here so that models whose q width (heads·head_dim) differs from h (gemma3) and models with more norms
# are counted per tensor:
ACT_NORM_BYTES = 4  # per normalized element: 2 (fused) ... 6 (eager, fp32 upcast saved); prior = the middle
# torch's LayerNorm saves its input (the residual stream, kept anyway) and a mean/rstd per token: only its output is
# new (saved by the next linear) [V: CPU meter, tiny starcoder2, 1 element per h where llama's RMSNorm keeps 2].
ACT_LAYER_NORM_BYTES = 2
# Q (2 B) + attention output (2 B) per q element (heads·head_dim), K and V (2 B each) per kv element, derived;
# measured on the CPU meter (SDPA) by varying head_dim and kv heads of a tiny llama reward model: 3.25 B for
# both [V: 1,667 B per token-layer for +256 q elements, 820 B for +128 kv elements, at fp32].
ACT_Q_AND_ATTN_OUT_BYTES = 3.25
ACT_KV_BYTES = 3.25
# q/k RMSNorms over head_dim (qwen3, gemma3, olmo2): cheaper than a hidden-size norm, their output goes to RoPE
# [V: 3.1 to 3.7 B per element on the CPU meter, qwen3 and gemma3 reward models].
ACT_QK_NORM_BYTES = 3.5
ACT_MLP_BYTES = 8  # gate out, up out, act(gate), product: 4 tensors x 2 B, per intermediate element
ACT_UNGATED_MLP_BYTES = 4  # fc out (saved by the activation), act(fc) (saved by the down projection)
# Copies that a family's layout adds to what a llama layer saves [V: CPU meter, reward models of tiny phi3 and glm4,
# 2048 tokens x 2 layers]: a fused q/k/v projection keeps its whole output alive (v, a slice of it, is saved by
# attention): q and k's share is extra (phi3, +3 MiB a layer); a partial-rotary RoPE concatenates the rotated part
# back, so q is laid out head-major and the attention output is copied by ``transpose(1, 2).contiguous()`` before
# o_proj (phi3 +2 MiB, glm4 +4 MiB a layer). Saved tensors, not computed ones: no backward temporaries of their own.
ACT_FUSED_QKV_BYTES = 2  # per q and kv element
ACT_ROPE_CONCAT_BYTES = 2  # per q element
# Mixture-of-experts layers (transformers 5, ``grouped_mm`` experts): per (token, chosen expert) pair the gathered
# input and the expert's output (2 tensors of h), its gate_up output (2·I_e), act(gate) and the product (I_e each);
# the routing keeps int64 indices (top-k, sort permutation, its inverse) and the fp32 weights: bytes not scaled
# with the compute dtype; the router's fp32 softmax keeps one float per expert per token. A shared expert is a
# dense MLP (8 B per I_s) whose output is scaled by a sigmoid gate [D: transformers/integrations/moe.py].
ACT_EXPERT_PAIR_BYTES_PER_H = 4
ACT_EXPERT_PAIR_BYTES_PER_I = 8
ROUTING_BYTES_PER_PAIR = 28  # 3 int64 indices + 1 fp32 weight
ROUTER_BYTES_PER_EXPERT = 4
SHARED_GATE_BYTES_PER_H = 2
# ⇒ for a qwen2/llama layer: 4·2h (two norms) + 3.25h + 3.25·h_kv + 8·I: c_h about 11 (8..16 in 2.4).
# Outside the decoder layers, per token: embedding output, final norm, the hidden state handed to the LM head
# (a compact copy on CUDA) [A]: a few h.
ACT_OUTSIDE_LAYERS_BYTES_PER_H = 8
# A decoder layer's backward allocates gradient temporaries on top of the saved activations: about half a layer's
# saved activations [V: measured on the CPU meter, tiny-qwen2 reward model, 9 KB/token over 18 KB per layer].
BACKWARD_TEMP_LAYERS = 0.5
# 2.4, HF gradient checkpointing: keeps every layer's input (h per token per layer) plus, during the backward, one
# layer's full activations while it is recomputed plus that layer's backward temporaries [V concept]
# (``activation_bytes``).
# 2.4, eager attention materializes the scores (heads x s² x batch per layer). transformers' eager path keeps the
# softmax in fp32 (``softmax(..., dtype=float32)``, saved: 4 B) and its cast to the compute dtype (saved by the
# matmul with V; none when computing in fp32); dropout 0 keeps no mask; gemma2's score softcapping keeps the tanh
# output (one element in the compute dtype). A layer's backward adds one fp32 gradient of its scores
# [V: measured on the CPU meter, tiny gemma2, 4.0 B and +4.0 B per element with softcapping at fp32]. Korthikanti's
# 5 B (dropout mask included) is the same order. SDPA flash/efficient: none.
EAGER_SOFTMAX_BYTES = 4
EAGER_BACKWARD_BYTES = 4
# TRL's activation offloading (``activation_offloading``, 1.16 ``OffloadActivations``) copies each saved tensor to host
# memory as the forward pass makes it and keeps the device copy until 5 later tensors are offloaded
# (``max_fwd_stash_size``); the LM head's inputs stay (a no-op region). The backward pass brings each autograd node's
# tensors back as it reaches it and frees the previous node's. Device shares, of one layer's saved activations:
OFFLOAD_STASH_TENSORS = 5  # with checkpointing the stash is the last 5 layer inputs
# at the head: the last MLP's and the final norm's tensors [V: CPU meter, tiny-qwen2 SFT, 0.48]
OFFLOAD_HEAD_LAYERS = 0.5
# at a layer's backward: the node's tensors, the previous node's, what the stash still held [V: CPU meter, tiny-qwen2
# reward, 0.72; on a GPU a brought-back tensor lives one node longer than on the simulated device: A]
OFFLOAD_BACKWARD_LAYERS = 0.75
# Host: every layer's saved tensors (with checkpointing, their inputs) and the tensors outside the layers, which
# are offloaded twice over the ledger's device share (the embedding output and the final norm's input are saved by
# more than one op) [V: CPU meter, tiny-qwen2 SFT and reward, -1%].
OFFLOAD_OUTSIDE_COPIES = 2
# Liger's kernels (``use_liger_kernel``) [D: liger_kernel's RMSNorm and SiLU-mul autograd functions against
# transformers' modules; V: CPU meter, tiny-qwen2 reward model with a stand-in of the same saved-tensor contract
# (tests/liger_stand_in), 38 MiB saved of the predicted 38 MiB in full fine-tuning, 22 of 22 under LoRA]. The fused
# RMSNorm saves its input (compute dtype) and one fp32 value per row; transformers' saves a float32 copy of the input
# (the input itself when that is float32 already) and, when the norm's weight trains, the normalized tensor. The
# fused SwiGLU saves the gate and up projections and recomputes act(gate): one tensor of the intermediate size less.
# Absolute bytes per element, not scaled with the compute dtype. Families Liger patches (its
# MODEL_TYPE_TO_APPLY_LIGER_FN, 0.6); for others it patches nothing and the probe says so
# (``autofit.rungs.liger._probe``).
LIGER_FAMILIES = ("gemma", "gemma2", "gemma3", "gemma3_text", "glm4", "granite", "llama", "mistral", "mixtral", "olmo2",
                  "phi3", "qwen2", "qwen3", "qwen3_moe")
FP32_BYTES = 4
# rl.py: synthetic prompts are ``prompt_length or 64`` tokens long.
DEFAULT_PROMPT_LENGTH = 64


def sequence_length(candidate: Candidate) -> int:
    """Tokens of one training sequence: RL trains on prompt + completion."""
    if candidate.is_rl:
        return (candidate.prompt_length or DEFAULT_PROMPT_LENGTH) + candidate.max_length
    return candidate.max_length


def sequences_per_micro_batch(candidate: Candidate) -> int:
    """The reward trainer concatenates the chosen and the rejected sides: 2 sequences per example."""
    return candidate.unit.sequences_per_example * candidate.micro_batch


def train_tokens(candidate: Candidate) -> int:
    return sequences_per_micro_batch(candidate) * sequence_length(candidate)


def liger_saving_per_token_layer(shape: ModelShape, act_bytes: int, norms_train: bool) -> float:
    """Bytes per token per decoder layer that Liger's RMSNorm and SwiGLU kernels do not save (see LIGER_FAMILIES)."""
    if shape.model_type not in LIGER_FAMILIES:
        return 0.0
    norm = 0.0
    if not shape.layer_norm:
        per_element = max(FP32_BYTES - act_bytes, 0) + (act_bytes if norms_train else 0)
        qk_norm_elems = shape.q_dim + shape.kv_dim if shape.qk_norm else 0
        norm = per_element * (shape.norms_per_layer * shape.hidden + qk_norm_elems)
    mlp = act_bytes * shape.intermediate * shape.dense_layers / shape.layers if shape.gated_mlp else 0.0
    return norm + mlp


def activation_bytes_per_token_layer(shape: ModelShape, act_bytes: int, lora: Optional[LoraSettings] = None,
                                     algo: str = DEFAULT_ALGO, liger: bool = False, norms_train: bool = True) -> float:
    """Bytes saved for backward per token per decoder layer without checkpointing (memory-facts 2.4); with
    ``liger``, what Liger's kernels save instead (``norms_train``: the norms' weights are trained)."""
    scale = act_bytes / 2  # the coefficients are bytes at 2-byte activations
    qk_norm_elems = shape.q_dim + shape.kv_dim if shape.qk_norm else 0
    norm = ACT_LAYER_NORM_BYTES if shape.layer_norm else ACT_NORM_BYTES
    mlp = ACT_MLP_BYTES if shape.gated_mlp else ACT_UNGATED_MLP_BYTES
    per = (norm * shape.norms_per_layer * shape.hidden + ACT_QK_NORM_BYTES * qk_norm_elems
           + ACT_Q_AND_ATTN_OUT_BYTES * shape.q_dim + ACT_KV_BYTES * shape.kv_dim
           + (shape.dense_layers * mlp * shape.intermediate
              + shape.moe_layers * _expert_bytes_at_2(shape)) / shape.layers) + _layout_copies_at_2(shape)
    if lora is not None and lora.dropout > 0:
        inputs = lora_inputs_per_layer(census_for(shape, algo), shape.layers, lora.target_modules)  # 6h + I
        per += LORA_DROPOUT_BYTES_PER_ELEMENT * inputs
    per *= scale
    if shape.moe_layers:  # index and fp32 routing tensors: their size does not follow the compute dtype
        routing = (ROUTING_BYTES_PER_PAIR * shape.experts_per_token + ROUTER_BYTES_PER_EXPERT * shape.experts)
        per += routing * shape.moe_layers / shape.layers
    if liger:
        per -= liger_saving_per_token_layer(shape, act_bytes, norms_train)
    return per


def _norms_train(candidate: Candidate) -> bool:
    return candidate.lora is None and candidate.quantization is None


def _per_layer(candidate: Candidate, shape: ModelShape, act_bytes: int) -> float:
    return activation_bytes_per_token_layer(shape, act_bytes, candidate.lora, candidate.algo,
                                            activation_policy(candidate).liger_kernels, _norms_train(candidate))


def _layout_copies_at_2(shape: ModelShape) -> float:
    """The copies a fused q/k/v projection and a concatenating RoPE keep per token per layer, at 2-byte activations."""
    return (ACT_FUSED_QKV_BYTES * (shape.q_dim + shape.kv_dim) if shape.fused_qkv else 0) + \
        (ACT_ROPE_CONCAT_BYTES * shape.q_dim if shape.rope_concat else 0)


def _expert_bytes_at_2(shape: ModelShape) -> float:
    """A mixture-of-experts block's saved activations per token, at 2-byte activations (routing aside)."""
    pairs = shape.experts_per_token * (ACT_EXPERT_PAIR_BYTES_PER_H * shape.hidden
                                       + ACT_EXPERT_PAIR_BYTES_PER_I * shape.expert_intermediate)
    shared = ACT_MLP_BYTES * shape.shared_intermediate + SHARED_GATE_BYTES_PER_H * shape.hidden \
        if shape.shared_intermediate else 0
    return pairs + shared


def activation_bytes(candidate: Candidate, shape: ModelShape, act_bytes: int) -> Tuple[float, float]:
    """(bytes at the LM head's backward, bytes at a decoder layer's backward). Two moments of the forward/backward:
    the LM head's backward holds every saved activation (and the head's buffers, counted in ``logits``); a decoder
    layer's backward holds its gradient temporaries (with checkpointing, the recomputed layer too) once the head's
    buffers are gone."""
    tokens = train_tokens(candidate)
    per_layer = _per_layer(candidate, shape, act_bytes)
    # a layer's backward temporaries as without Liger: its kernels' backward passes work in place
    plain = activation_bytes_per_token_layer(shape, act_bytes, candidate.lora, candidate.algo)
    temporaries = BACKWARD_TEMP_LAYERS * (plain - _layout_copies_at_2(shape) * act_bytes / 2)
    outside = ACT_OUTSIDE_LAYERS_BYTES_PER_H * shape.hidden * act_bytes / 2
    policy = activation_policy(candidate)
    if policy.offloads_activations:
        if policy.recomputes:
            saved = tokens * (min(OFFLOAD_STASH_TENSORS, shape.layers) * shape.hidden * act_bytes + outside)
            layer_moment = saved + tokens * (per_layer + temporaries)
        else:
            saved = tokens * (OFFLOAD_HEAD_LAYERS * per_layer + outside)
            layer_moment = tokens * (outside + OFFLOAD_BACKWARD_LAYERS * per_layer + temporaries)
    elif policy.recomputes:
        saved = tokens * (shape.layers * shape.hidden * act_bytes + outside)
        layer_moment = saved + tokens * (per_layer + temporaries)
    else:
        saved = tokens * (shape.layers * per_layer + outside)
        layer_moment = saved + tokens * temporaries
    if shape.eager_attention:
        seq = sequence_length(candidate)
        elements = shape.heads * seq * seq * sequences_per_micro_batch(candidate)
        per_element = EAGER_SOFTMAX_BYTES + (act_bytes if act_bytes < 4 else 0) + \
            (act_bytes if shape.attention_softcap else 0)
        scores = per_element * elements
        if policy.one_layer_on_device:  # recomputed or offloaded: one layer's scores on the device
            layer_moment += scores + EAGER_BACKWARD_BYTES * elements
        else:
            saved += scores * shape.layers
            layer_moment += scores * shape.layers + EAGER_BACKWARD_BYTES * elements
    return saved, layer_moment


def offloaded_activation_bytes(candidate: Candidate, shape: ModelShape, act_bytes: int) -> float:
    """Host memory activation offloading takes at the end of the forward pass: every layer's saved tensors (with
    checkpointing, every layer's input) and those outside the layers."""
    policy = activation_policy(candidate)
    if not policy.offloads_activations:
        return 0.0
    outside = ACT_OUTSIDE_LAYERS_BYTES_PER_H * shape.hidden * act_bytes / 2
    if policy.recomputes:
        return train_tokens(candidate) * (shape.layers * shape.hidden * act_bytes + outside)
    per_layer = _per_layer(candidate, shape, act_bytes)
    return train_tokens(candidate) * (shape.layers * per_layer + OFFLOAD_OUTSIDE_COPIES * outside)
