"""What a training step moves besides its matmuls: the bytes of its elementwise work per micro-batch.

The norms (transformers' RMSNorm upcasts to fp32 and back), the rotary embedding, the gated MLP's activation and
product, the residual adds and casts, each with its gradient in the backward, and LoRA's dropout, scale and add per
adapted module, each read and write whole activations: bound by memory bandwidth, not FLOPs. Counted, not fitted:
``python -m benchmarks.traffic_counts`` adds up the bytes every such operator reads and writes (a TorchDispatchMode over
tiny-qwen2's architecture with transformers 5 and peft, views, matmuls, the attention kernel and the embedding
excluded) and gives them per token and layer, per unit of the hidden size and of the MLP's intermediate size, for
the three ways a step holds its weights [M: that benchmark, 2026-11-27]. A family with other norms or no gated MLP
differs by a few of these passes.
"""

from __future__ import annotations

from typing import Dict, NamedTuple

from autofit.core import Candidate
from autofit.memory_model._activation_policy import activation_policy
from autofit.memory_model._parameters import census_for, weight_bytes
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._speed_band import compiled


class LayerTraffic(NamedTuple):
    """Bytes per token and layer: per unit of the hidden size, and per unit of the MLP's intermediate size."""

    hidden: float
    intermediate: float


class AdapterTraffic(NamedTuple):
    """Bytes per token and LoRA-adapted module: per input feature, and per output feature."""

    per_input: float
    per_output: float


class ModeTraffic(NamedTuple):
    forward: LayerTraffic
    backward: LayerTraffic
    recompute: LayerTraffic  # checkpointing's recomputed forward, its hooks included
    lora_forward: AdapterTraffic  # with dropout (its mask and product)
    lora_backward: AdapterTraffic
    lora_forward_no_dropout: AdapterTraffic
    lora_backward_no_dropout: AdapterTraffic


# Weights in bf16 (or a quantized base's bf16 rest), in fp32 without autocast (the CPU meter), and in fp32 under
# bf16 autocast (TRL's default on CUDA: it loads fp32 weights). A LoRA backward's negative count per output feature
# (the bias gradient a frozen base no longer computes, -32) is taken as 0.
TRAFFIC: Dict[str, ModeTraffic] = {
    "bf16": ModeTraffic(LayerTraffic(126.7, 18.0), LayerTraffic(280.8, 18.0), LayerTraffic(112.7, 18.0),
                        AdapterTraffic(34.0, 32.5), AdapterTraffic(24.0, 0.0),
                        AdapterTraffic(6.0, 32.5), AdapterTraffic(12.0, 0.0)),
    "fp32": ModeTraffic(LayerTraffic(165.2, 36.0), LayerTraffic(369.3, 36.0), LayerTraffic(137.2, 36.0),
                        AdapterTraffic(28.0, 28.5), AdapterTraffic(24.0, 0.0),
                        AdapterTraffic(0.0, 28.5), AdapterTraffic(12.0, 0.0)),
    "autocast": ModeTraffic(LayerTraffic(175.2, 18.0), LayerTraffic(392.3, 18.0), LayerTraffic(155.2, 18.0),
                            AdapterTraffic(43.4, 4.8), AdapterTraffic(30.0, 0.0),
                            AdapterTraffic(15.4, 4.8), AdapterTraffic(18.0, 0.0)),
}
# A decoder layer as ``torch.compile`` (inductor) runs it, bf16 weights: its norms, rotary, the MLP's activation and
# product and the residual adds fused into a few kernels that read their inputs and write their outputs once, the
# backward likewise (AOTAutograd's partition) [M: inductor's own byte count of every kernel it generates
# (``GraphLowering.count_bytes``; its extern kernels, the matmuls and the attention, left out) over tiny-qwen2's
# decoder at 2 and 4 layers, two lengths and two MLP widths, torch 2.13's inductor on the CPU
# (``python -m benchmarks.compile_counts``, 2026-12-02); a GPU's Triton fusion may keep a few more passes apart].
# Checkpointing's recompute is a compiled forward. Other ways of holding the weights are scaled by the same ratio to
# their eager counts; LoRA's adapters have counts of their own (``COMPILED_LORA``).
COMPILED = (LayerTraffic(35.0, 6.0), LayerTraffic(50.2, 10.0))
# peft's LoRA adapters as ``torch.compile`` runs them, bf16 base and peft's float32 adapters: the input's cast, the
# dropout, the scale, the output's cast and the add fused with their neighbours, per token and adapted module, per
# input and per output feature, forward and backward (the frozen base's saved bias gradient, negative per output, taken
# as 0 as for eager), without dropout and with it [M: inductor's byte count as for ``COMPILED``, tiny-qwen2 at 2 and 4
# layers with LoRA r16 on q_proj or down_proj against none, torch 2.13's inductor on the CPU and peft,
# ``python -m benchmarks.compile_counts``, 2026-12-03]. Used for every way of holding the weights (counted on bf16).
COMPILED_LORA = {False: (AdapterTraffic(1.7, 10.3), AdapterTraffic(6.3, 0.0)),
                 True: (AdapterTraffic(2.1, 11.9), AdapterTraffic(7.3, 0.0))}
# LoRA's dropout on a GPU: torch runs it as one fused kernel (``native_dropout``: the input read, the output written
# and a one-byte mask) where the CPU composes it of a float noise tensor, its scaling and a product, which the counts
# above measured [V code: torch aten/src/ATen/native/Dropout.cpp, ``is_fused_kernel_acceptable`` (CUDA, XPU) against
# ``_dropout_impl``]; its backward reads the gradient and the mask and writes one. peft drops out the input cast to
# the adapters' float32: bytes per input feature and token, added to the no-dropout counts.
FUSED_DROPOUT_FORWARD_BYTES = 4 + 4 + 1
FUSED_DROPOUT_BACKWARD_BYTES = 4 + 1 + 4
# A mixture-of-experts layer's routing beyond its experts' MLPs (each token gathered to its experts, weighted and
# added back; transformers' expert loop), per token per hidden unit per expert the token runs, forward and backward
# (the recompute as the forward), counted in bf16 on a Mixtral of tiny-qwen2's sizes.
MOE_ROUTING_FORWARD, MOE_ROUTING_BACKWARD = 27.4, 136.0


class PassBytes(NamedTuple):
    """Elementwise bytes of one micro-batch's forward, backward and checkpointing's recompute."""

    forward: float
    backward: float
    recompute: float


def traffic_mode(candidate: Candidate, shape: ModelShape, cpu: bool) -> str:
    """How the step holds its weights: fp32 ones run under bf16 autocast on CUDA and as they are on the CPU."""
    if candidate.quantization is not None or weight_bytes(candidate, shape) <= 2:
        return "bf16"
    return "fp32" if cpu else "autocast"


def elementwise_bytes(candidate: Candidate, shape: ModelShape, tokens: float, cpu: bool) -> PassBytes:
    """The bytes ``tokens`` tokens of one micro-batch move outside the matmuls and the attention kernel, by pass."""
    mode = TRAFFIC[traffic_mode(candidate, shape, cpu)]
    intermediate = shape.dense_layers * shape.intermediate + shape.moe_layers * (
        shape.experts_per_token * shape.expert_intermediate + shape.shared_intermediate)

    def layers(traffic: LayerTraffic) -> float:
        return tokens * (shape.layers * shape.hidden * traffic.hidden + intermediate * traffic.intermediate)

    forward, backward, recompute = layers(mode.forward), layers(mode.backward), layers(mode.recompute)
    if compiled(candidate) and not cpu:  # the CPU meter's rates were measured eager
        eager = TRAFFIC["bf16"]
        forward *= layers(COMPILED[0]) / layers(eager.forward)
        backward *= layers(COMPILED[1]) / layers(eager.backward)
        recompute *= layers(COMPILED[0]) / layers(eager.recompute)
    if shape.moe_layers:
        routed = tokens * shape.moe_layers * shape.hidden * shape.experts_per_token
        forward += routed * MOE_ROUTING_FORWARD
        recompute += routed * MOE_ROUTING_FORWARD
        backward += routed * MOE_ROUTING_BACKWARD
    if candidate.lora is not None:
        modules = census_for(shape, candidate.algo).lora_modules(candidate.lora.target_modules)
        inputs, outputs = sum(g.d_in * g.count for g in modules), sum(g.d_out * g.count for g in modules)

        def adapters(traffic: AdapterTraffic) -> float:
            return tokens * (inputs * traffic.per_input + outputs * traffic.per_output)

        dropout = candidate.lora.dropout > 0
        if compiled(candidate) and not cpu:
            adapters_forward, adapters_backward = (adapters(traffic) for traffic in COMPILED_LORA[dropout])
        elif dropout and not cpu:  # the fused kernel on the no-dropout counts
            adapters_forward = adapters(mode.lora_forward_no_dropout) + tokens * inputs * FUSED_DROPOUT_FORWARD_BYTES
            adapters_backward = adapters(mode.lora_backward_no_dropout) + tokens * inputs * FUSED_DROPOUT_BACKWARD_BYTES
        else:
            adapters_forward = adapters(mode.lora_forward if dropout else mode.lora_forward_no_dropout)
            adapters_backward = adapters(mode.lora_backward if dropout else mode.lora_backward_no_dropout)
        forward += adapters_forward
        recompute += adapters_forward
        backward += adapters_backward
    return PassBytes(forward, backward, recompute if activation_policy(candidate).recomputes else 0.0)
