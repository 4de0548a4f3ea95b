"""The host's share of a step: the operators eager PyTorch dispatches per micro-batch, and how much of their
dispatch the device waits for.

CUDA launches are asynchronous: the host queues kernels ahead of the device, so dispatch only adds to a pass where
the device runs out of queued work, and everything the host queued is drained at each synchronization. A TRL step
synchronizes twice a micro-batch: after the forward (TRL's trainers log their metrics with ``.item()`` inside
``compute_loss``: SFT's entropy and token accuracy) and after the backward (the Trainer's ``logging_nan_inf_filter``
tests the loss with ``torch.isnan(...)`` in a Python ``or``) [V code: trl 1.16 trainer/sft_trainer.py
``compute_loss``; transformers 5.17 trainer.py, the training loop]. So a segment between two synchronizations takes
the longer of its device time and its dispatch: a small model (or short rows) is launch-bound, a large one
device-bound. On the CPU meter the same thread dispatches and computes: every operator's cost adds.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple

from autofit.core import Candidate, Card
from autofit.memory_model._activation_policy import activation_policy
from autofit.memory_model._engine_settings import hooks_every_module, zero_engine
from autofit.memory_model._parameters import Tensors, census_for, head_trained
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._speed_band import compiled
from autofit.memory_model._traffic import PassBytes

# Operators eager PyTorch dispatches, each costing the card's ``op_seconds`` of host time [M: counted with a
# TorchDispatchMode by ``python -m benchmarks.operator_counts`` on tiny-qwen2 with transformers 5.17, TRL 1.16's fused
# LM head (its torch fallback) and peft; a layer of another family differs by its norms and rotary, a few operators]:
# per decoder layer and pass, checkpointing's recomputed forward (its hooks included), the rest of a pass
# (embeddings, rotary tables, the final norm, the fused head and the loss; a frozen head's backward has fewer),
# LoRA's adapter per module and pass (dropout, A, B, the scale, the add) and the optimizer's step with gradient
# clipping per trainable tensor, or per step where it runs foreach (CUDA).
OPS_FORWARD_PER_LAYER = 73
OPS_BACKWARD_PER_LAYER = 147
OPS_RECOMPUTE_PER_LAYER = 130
OPS_FORWARD_REST = 120
OPS_BACKWARD_REST = 64
OPS_BACKWARD_REST_FROZEN_HEAD = 12
OPS_LORA_FORWARD_PER_MODULE = 10  # and as many again in a recompute
OPS_LORA_BACKWARD_PER_MODULE = 13
OPS_OPTIMIZER_PER_TENSOR = 10
OPS_OPTIMIZER_FOREACH = 30  # [A: a few foreach kernels per state and group]
# bitsandbytes' optimizers synchronize after each tensor (``synchronized_optimizer``): each costs its update kernel's
# dispatch and the synchronization's round trip in series with the kernel [A: two operators of host time], and a
# paged one's two prefetches of its states (``prefetch_state``, cudaMemPrefetchAsync through ctypes) [V code:
# bitsandbytes optim/optimizer.py; an operator each]
OPS_PER_TENSOR_SYNCED = 2
OPS_PAGED_PREFETCH = 2
# Kernels a decoder layer launches compiled (``torch_compile``): inductor's generated kernels and its extern ones (the
# matmuls, the attention) per layer, forward and backward [M: counted with ``_traffic.COMPILED``'s bytes, tiny-qwen2,
# torch 2.13's inductor on the CPU, ``benchmarks.compile_counts``: 13 + 10 forward, 12 + 18 backward]; a recompute
# launches a forward's
KERNELS_COMPILED_FORWARD_PER_LAYER = 23
KERNELS_COMPILED_BACKWARD_PER_LAYER = 30
# A LoRA adapter compiled: its two matmuls forward, their four gradients' backward, the elementwise work fused into
# the layer's kernels [M: the same counts with LoRA on one module: 0 generated + 2 extern kernels forward;
# the backward's four matmuls A: its count is confounded with the frozen base's own weight gradients]
KERNELS_COMPILED_LORA_FORWARD = 2
KERNELS_COMPILED_LORA_BACKWARD = 4
# DeepSpeed ZeRO-3's host work per submodule, in operators' worth of this host's dispatch: its four hooks on every
# module (fetch and release for the forward, two autograd functions that fetch and release for the backward;
# checkpointing's recompute runs the forward's again) [V code: DeepSpeed 0.19 ``runtime/zero/parameter_offload.py``;
# M: ``python -m benchmarks.zero3_hooks``, one-rank ZeRO-3 against plain PyTorch on a tiny qwen2, two runs on this
# 2-core host: forward 25-30, backward 21-25, recompute 31-35 operators a module, 2026-12-03]. Python whatever the
# card, so priced with the card's ``op_seconds`` and overlapped with the device as the other operators are
OPS_ZERO3_FORWARD_PER_MODULE = 27
OPS_ZERO3_BACKWARD_PER_MODULE = 23
OPS_ZERO3_RECOMPUTE_PER_MODULE = 33
# bitsandbytes' 4-bit base, per quantized linear layer under peft's LoRA, in operators' worth of this host's dispatch:
# the forward's ``gemm_4bit`` (past a few rows the nested absmax and the weight dequantized by bitsandbytes' Python
# kernels over its C library, then ``F.linear``) with peft's defensive clone of its output, the backward's
# dequantization for the input's gradient, a recompute's forward again [V code: bitsandbytes 0.50
# ``autograd/_functions.py`` ``MatMul4Bit``, ``backends/cuda/ops.py`` ``_dequant_linear_fallback``; peft
# ``tuners/lora/bnb.py``; M: ``python -m benchmarks.qlora_host``, one adapted projection over the 4-bit base against
# the float one on this 2-core host, 2026-12-03: forward 22-27, backward 15-19 in three runs under load, 25-27 and
# 17-22 in three quiet ones]. Python whatever the card, priced like the other operators; bitsandbytes' 8-bit base is
# not measured and not charged
OPS_QUANT4_FORWARD_PER_LAYER = 25
OPS_QUANT4_BACKWARD_PER_LAYER = 17
# The modules a qwen2 decoder layer has (itself, attention, its four projections, the MLP, its three projections
# and activation, two norms), the model's others (the model, embeddings, rotary, final norm, head, the wrapper), and
# those peft's LoRA adds to an adapted linear layer (its base layer, dropout, A and B with their containers) [M:
# counted with ``nn.Module.modules`` on tiny-qwen2 at 8 layers (111) and on one peft-adapted linear layer (+10)]
MODULES_PER_LAYER = 13
MODULES_REST = 7
MODULES_PER_LORA = 10
# The share of TRL's fused head's tile traffic in its forward: with Triton it reads the tile once in the forward and
# reads and writes it in the backward (``_throughput.HEAD_TILE_PASSES_TRITON``)
HEAD_TILES_FORWARD_SHARE = 1 / 3
# The device terms of a micro-batch's passes, by the segment they run in; the rest of a step (the optimizer, the
# reductions, generation) is not dispatched operator by operator here
DEVICE_TERMS = ("forward", "backward", "recompute", "attention", "elementwise", "LoRA adapters", "LM head tiles",
                "dequantize")


class Segments(NamedTuple):
    """One micro-batch's two stretches between synchronizations."""

    forward: float
    backward: float  # checkpointing's recompute included: it runs inside the backward


def pass_operators(candidate: Candidate, shape: ModelShape, trained: List[Tensors], card: Card) -> Segments:
    """Operators one micro-batch dispatches in its forward and in its backward with checkpointing's recompute
    (compiled on a GPU: inductor's kernels for each decoder layer)."""
    forward, backward, recompute = OPS_FORWARD_PER_LAYER, OPS_BACKWARD_PER_LAYER, OPS_RECOMPUTE_PER_LAYER
    lora_forward, lora_backward = OPS_LORA_FORWARD_PER_MODULE, OPS_LORA_BACKWARD_PER_MODULE
    if compiled(candidate) and not card.cpu:
        forward = recompute = KERNELS_COMPILED_FORWARD_PER_LAYER
        backward = KERNELS_COMPILED_BACKWARD_PER_LAYER
        lora_forward, lora_backward = KERNELS_COMPILED_LORA_FORWARD, KERNELS_COMPILED_LORA_BACKWARD
    recomputes = activation_policy(candidate).recomputes
    backward_per_layer = backward + (recompute if recomputes else 0)
    adapters_forward = adapters_backward = 0.0
    if candidate.lora is not None:  # A and B per adapted module
        modules = sum(t.count for t in trained) / 2
        adapters_forward = modules * lora_forward
        adapters_backward = modules * (lora_backward + (lora_forward if recomputes else 0))
    rest = OPS_BACKWARD_REST if head_trained(candidate) else OPS_BACKWARD_REST_FROZEN_HEAD
    hooks_forward, hooks_backward = zero3_hook_operators(candidate, shape, trained)
    base_forward, base_backward = quantized_base_operators(candidate, shape)
    return Segments(shape.layers * forward + OPS_FORWARD_REST + adapters_forward + hooks_forward + base_forward,
                    shape.layers * backward_per_layer + rest + adapters_backward + hooks_backward + base_backward)


def zero3_hook_operators(candidate: Candidate, shape: ModelShape, trained: List[Tensors]) -> Segments:
    """Operators' worth of host time ZeRO-3's module hooks take in one micro-batch's forward and backward (its
    recompute included); none under any other engine."""
    if not hooks_every_module(candidate.sharding or zero_engine(candidate)):
        return Segments(0.0, 0.0)
    modules: float = shape.layers * MODULES_PER_LAYER + MODULES_REST
    if candidate.lora is not None:  # A and B per adapted module
        modules += MODULES_PER_LORA * sum(t.count for t in trained) / 2
    recompute = OPS_ZERO3_RECOMPUTE_PER_MODULE if activation_policy(candidate).recomputes else 0
    return Segments(modules * OPS_ZERO3_FORWARD_PER_MODULE,
                    modules * (OPS_ZERO3_BACKWARD_PER_MODULE + recompute))


def quantized_base_operators(candidate: Candidate, shape: ModelShape) -> Segments:
    """Operators' worth of host time bitsandbytes' 4-bit layers take in one micro-batch's forward and backward (its
    recompute included), over every linear layer it quantizes; none for any other base."""
    if candidate.quantization != "4bit":
        return Segments(0.0, 0.0)
    layers = sum(group.count for group in census_for(shape, candidate.algo).linears if group.quantizable)
    recompute = OPS_QUANT4_FORWARD_PER_LAYER if activation_policy(candidate).recomputes else 0
    return Segments(layers * OPS_QUANT4_FORWARD_PER_LAYER, layers * (OPS_QUANT4_BACKWARD_PER_LAYER + recompute))


def device_segments(terms: Dict[str, float], traffic: PassBytes, micro: int, passes: int) -> Segments:
    """One micro-batch's device seconds by segment, from the step's terms so far (``micro`` micro-batches of
    ``passes`` passes, a recompute counted as one): attention and the adapters cost a forward's share per pass and two
    in the backward, the elementwise work by its counted bytes, dequantization once a pass."""
    share = {"forward": 1.0, "backward": 0.0, "recompute": 0.0, "attention": 1 / (passes + 1),
             "LoRA adapters": 1 / (passes + 1), "LM head tiles": HEAD_TILES_FORWARD_SHARE,
             "dequantize": 1 / passes, "elementwise": traffic.forward / sum(traffic) if sum(traffic) else 0.0}
    forward = sum(terms.get(name, 0.0) * share[name] for name in DEVICE_TERMS) / micro
    total = sum(terms.get(name, 0.0) for name in DEVICE_TERMS) / micro
    return Segments(forward, total - forward)


def exposed_dispatch(operators: Segments, card: Card, device: Segments) -> float:
    """Seconds of one micro-batch's dispatch that the device waits for: per segment what the host's operators take
    beyond the device's own time (all of it on the CPU meter, whose thread does both)."""
    if card.cpu:
        return sum(operators) * card.op_seconds
    return sum(max(0.0, ops * card.op_seconds - busy) for ops, busy in zip(operators, device, strict=True))
