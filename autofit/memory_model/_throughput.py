"""How fast, before probing: the time of one optimizer step of a candidate on a card, from the shapes the ledger
knows, and the tokens per second it gives.

A roofline per pass: a forward or backward pass takes the longer of its matmul FLOPs at the card's achievable FLOP
rate and the bytes it must read at the achievable bandwidth, plus the host's dispatch of its operators where the device
waits for it (``_dispatch``: a GPU runs ahead of the host only as far as it has work queued). On top:
checkpointing's recomputed forward, 4/8-bit dequantization, the optimizer's pass over its states, activation and
optimizer offload over the host link, gradient reduction and ZeRO/FSDP gathers over the GPU link, and for RL the
generation (decode reads every weight and the KV cache once per token: bandwidth-bound) and the frozen models'
forwards. Pure Python, like the rest of the memory model.

The coefficients (what a step achieves of the card's peaks) are stated with their source and never fitted to a
published row; the search calibrates one scale on its own timed steps, as the memory model does on peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Tuple

from autofit.core import Candidate, Card
from autofit.memory_model._activation_policy import activation_policy
from autofit.memory_model._activations import sequence_length, sequences_per_micro_batch
from autofit.memory_model._dispatch import (
    OPS_FORWARD_PER_LAYER,
    OPS_OPTIMIZER_FOREACH,
    OPS_OPTIMIZER_PER_TENSOR,
    OPS_PAGED_PREFETCH,
    OPS_PER_TENSOR_SYNCED,
    device_segments,
    exposed_dispatch,
    pass_operators,
)
from autofit.memory_model._engine_settings import shards_parameters, zero_engine
from autofit.memory_model._host_time import activation_offload_seconds, host_terms
from autofit.memory_model._logits import logit_tokens
from autofit.memory_model._parameters import (
    _beta,
    census_for,
    head_trained,
    holds_reference,
    param_counts,
    synchronized_optimizer,
    trainable_tensors,
    weight_bytes,
)
from autofit.memory_model._rungs import with_rung_speeds
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._speed_band import PRIOR_SPEED_UNCERTAINTY, speed_band
from autofit.memory_model._traffic import elementwise_bytes

# What a large matmul achieves of the card's peak tensor FLOP rate [M: Dao 2023, FlashAttention-2 (arXiv 2307.08691),
# section 1: "optimized GEMM can reach up to 80-90% of the theoretical maximum device throughput" on an A100; the low
# end]. The rest of a step that a model FLOPs utilization (PaLM's 46%, Megatron-LM's 52%) also counts is the model's
# own terms here: attention, elementwise traffic, launches, the optimizer. Small matmuls achieve less: the efficiency
# halves at the card's ``half_rows`` rows per matmul.
GEMM_EFFICIENCY = 0.80
# The attention kernel (flash attention, or SDPA's flash/memory-efficient kernels) [M: Dao 2023, FlashAttention-2
# reaches "50-73% of the theoretical maximum FLOPs/s" on an A100, forward and backward; the low end, for a
# fine-tune's shorter sequences]. On the CPU meter attention runs at the measured matmul rate.
ATTENTION_EFFICIENCY = 0.50
BANDWIDTH_EFFICIENCY = 0.80  # [M: STREAM-like copies reach 80-90% of HBM's peak]
GPU_LINK_EFFICIENCY = 0.70  # [M: nccl-tests' bus bandwidth, 70-80% of NVLink's peak]
# vLLM's host time per decode step with CUDA graphs (its scheduler, the sampler, one graph replay) [A: an assumption,
# no published figure found; vLLM's docs: "CUDA graph optimization - kernel launch overhead eliminated"]
VLLM_STEP_SECONDS = 1e-3
# vLLM waking from sleep level 2 once a generation round (TRL's sleep mode): its weights' and KV cache's memory mapped
# again, the weights then synced (priced apart) [A: vLLM's blog "Zero-Reload Model Switching with vLLM Sleep Mode",
# 2025-10-26, measures a level-2 wake of 0.8-2.6 s that includes reloading the weights from disk, which TRL replaces
# by its sync; the mapping alone is taken as the low end's half]
VLLM_WAKE_SECONDS = 0.4
# TRL's fused LM head with Triton reads the logits tile once in its forward and reads and writes it in its backward,
# in the compute dtype [V code: trl 1.16 kernels/chunked_logprob.py]; without Triton (the CPU) its torch fallback
# makes about 24 whole-tile fp32 passes, 10 in the forward (scale, temperature, the top-1 mask, max, exp, the
# entropy's sums) and 14 in the backward (the recomputed scale, exp, the target mask, the gradient's terms), each at
# the card's measured ``elementwise_seconds`` per element.
HEAD_TILE_PASSES_TRITON = 3
HEAD_TILE_PASSES_TORCH = 24
# The CPU meter's rates where a caller measured only the matmul and the copy [M: ``autofit.probe._rates`` on a
# 2-core x86 runner]: an operator of a model under the simulated meter, a CPU matmul's half-rate rows, and an
# element of a whole-tensor fp32 pass
CPU_OP_SECONDS = 18e-6
CPU_HALF_ROWS = 16.0
CPU_ELEMENTWISE_SECONDS = 0.35e-9


@dataclass(frozen=True)
class SpeedEstimate:
    seconds_per_step: float
    tokens_per_step: int
    uncertainty: float = PRIOR_SPEED_UNCERTAINTY
    terms: Dict[str, float] = field(default_factory=dict)  # seconds per optimizer step, by what takes them
    ranks: int = 1  # the GPUs whose tokens ``tokens_per_step`` counts
    notes: Tuple[str, ...] = ()  # what the prediction does not price, and the band it widens

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.seconds_per_step if self.seconds_per_step > 0 else 0.0

    @property
    def tokens_per_second_per_gpu(self) -> float:
        """What one GPU trains on per second: what the Trainer's ``train_tokens_per_second`` reports, since each
        process counts the tokens of its own batches."""
        return self.tokens_per_second / self.ranks

    def scaled(self, scale: float) -> SpeedEstimate:
        """The estimate with every term's time multiplied by ``scale`` (a calibration on timed steps)."""
        return SpeedEstimate(self.seconds_per_step * scale, self.tokens_per_step, self.uncertainty,
                             {k: v * scale for k, v in self.terms.items()}, self.ranks, self.notes)


def _matmul_efficiency(rows: float, card: Card) -> float:
    return GEMM_EFFICIENCY * rows / (rows + card.half_rows)


def _pass_seconds(flops: float, bytes_read: float, rows: Optional[float], card: Card) -> float:
    """A roofline: the longer of the matmuls at the achievable FLOP rate and the reads at the achievable bandwidth.
    ``rows``: the matmuls' rows, where few rows leave the tensor cores idle; None for decode, whose few rows are
    bound by reading the weights (the bandwidth term) instead."""
    efficiency = GEMM_EFFICIENCY if rows is None else _matmul_efficiency(rows, card)
    return max(flops / (card.flops * efficiency), bytes_read / (card.bandwidth * BANDWIDTH_EFFICIENCY))


def _adapter_seconds(candidate: Candidate, shape: ModelShape, rows: float, card: Card) -> float:
    """One forward of every LoRA adapter: A (d_in to r) and B (r to d_out) per adapted module, matmuls as thin as the
    rank, so at the efficiency of ``r`` rows (a GPU's are bound by reading their inputs instead). Their backward is two
    of these (the input's and the weights' gradients)."""
    assert candidate.lora is not None
    modules = census_for(shape, candidate.algo).lora_modules(candidate.lora.target_modules)
    widths = sum((g.d_in + g.d_out) * g.count for g in modules)
    rank = candidate.lora.r
    return _pass_seconds(2 * rank * widths * rows, widths * rows * 4, rank, card)  # fp32 adapters: inputs read


def _traffic_seconds(moved: float, card: Card) -> float:
    """Bytes of elementwise passes at the card's achievable bandwidth; on the CPU meter at its measured time per
    element of an fp32 pass (one read and one write: 8 bytes)."""
    if card.elementwise_seconds:
        return moved / 8 * card.elementwise_seconds
    return moved / (card.bandwidth * BANDWIDTH_EFFICIENCY)


def _active_parameters(shape: ModelShape, candidate: Candidate) -> Tuple[float, float]:
    """The linear parameters one token runs through (a mixture of experts': its ``experts_per_token`` of them), and
    those of them bitsandbytes quantizes. transformers 5 fuses the experts into tensors outside ``linear`` (never
    quantized); transformers 4 keeps them as quantized nn.Linear layers inside it."""
    counts = param_counts(shape, candidate.algo)
    if not shape.experts:
        return float(counts.linear), float(counts.linear)
    share = shape.experts_per_token / shape.experts
    if counts.experts:
        return counts.linear + counts.experts * share, float(counts.linear)
    experts = shape.moe_layers * shape.experts * 3 * shape.hidden * shape.expert_intermediate
    active = counts.linear - experts + experts * share
    return active, active


def _optimizer_bytes_per_param(candidate: Candidate, param_bytes: int) -> float:
    """Bytes the optimizer step reads and writes per trainable parameter."""
    optim = candidate.optim or "adamw_torch"
    weight = param_bytes if candidate.lora is None else 4  # adapters train in float32
    moment = 1 if "8bit" in optim else weight
    states = 0 if optim.startswith("sgd") else 1 if "lion" in optim else 2
    return 2 * weight + weight + states * 2 * moment  # the weight read and written, the gradient read, each state


def predict_speed(candidate: Candidate, shape: ModelShape, card: Card) -> SpeedEstimate:
    """Seconds per optimizer step of ``candidate`` on one ``card`` (per rank, the ranks stepping together) and the
    tokens it trains on, by term."""
    counts = param_counts(shape, candidate.algo)
    active, quantized = _active_parameters(shape, candidate)
    tied_head = shape.tied_embeddings and not candidate.unit.sequence_classifier  # a reward model has no LM head
    head = counts.lm_head or (counts.embedding if tied_head else 0)
    frozen_base = candidate.lora is not None or candidate.quantization is not None
    seq = sequence_length(candidate)
    rows = sequences_per_micro_batch(candidate) * seq  # tokens of one micro-batch
    head_rows = logit_tokens(candidate, "cpu" if card.cpu else "cuda") if head else 0
    attention = rows * 2 * shape.layers * shape.heads * shape.head_dim * seq  # causal scores and values
    # TRL's fused head recomputes the logits in its backward: the head's gradients come on top of a second forward
    head_backward = (3 if head_trained(candidate) else 2) * 2 * head * head_rows
    layers_forward = rows * 2 * active
    stored = 0.5 if candidate.quantization == "4bit" else 1 if candidate.quantization == "8bit" else 0
    bytes_per_weight: float = weight_bytes(candidate, shape) if not stored else 2
    weights = (active + head) * bytes_per_weight
    dequantize = float(quantized * (stored + 2 * 2)) if stored else 0.0  # read packed, write and read the bf16 copy
    policy = activation_policy(candidate)
    passes = policy.passes
    terms: Dict[str, float] = {}
    micro = candidate.grad_accum
    terms["forward"] = micro * _pass_seconds(layers_forward + 2 * head * head_rows, weights, rows, card)
    terms["backward"] = micro * _pass_seconds((1 if frozen_base else 2) * layers_forward + head_backward,
                                              2 * weights, rows, card)
    if policy.recomputes:  # transformers checkpoints the decoder layers: the head is not recomputed
        terms["recompute"] = micro * _pass_seconds(layers_forward, active * bytes_per_weight, rows, card)
    attention_rate = card.flops * (_matmul_efficiency(rows, card) if card.cpu else ATTENTION_EFFICIENCY)
    terms["attention"] = micro * (passes + 1) * attention / attention_rate  # its backward is two forwards
    traffic = elementwise_bytes(candidate, shape, rows, card.cpu)
    terms["elementwise"] = micro * _traffic_seconds(sum(traffic), card)
    if candidate.lora is not None:
        terms["LoRA adapters"] = micro * (passes + 1) * _adapter_seconds(candidate, shape, rows, card)
    if head_rows and card.elementwise_seconds:
        terms["LM head tiles"] = micro * HEAD_TILE_PASSES_TORCH * head_rows * shape.vocab * card.elementwise_seconds
    elif head_rows:
        terms["LM head tiles"] = micro * HEAD_TILE_PASSES_TRITON * 2 * head_rows * shape.vocab / (
            card.bandwidth * BANDWIDTH_EFFICIENCY)
    if dequantize:
        terms["dequantize"] = micro * passes * dequantize / (card.bandwidth * BANDWIDTH_EFFICIENCY)
    trained = trainable_tensors(shape, candidate)
    # the host's dispatch where the device waits for it (``_dispatch``)
    terms["launch"] = micro * exposed_dispatch(pass_operators(candidate, shape, trained, card), card,
                                               device_segments(terms, traffic, micro, passes))
    trainable = sum(t.numel * t.count for t in trained)
    param_bytes = weight_bytes(candidate, shape)
    offloaded = host_terms(candidate, card, trainable, counts.total, passes)
    if not any(name.startswith("optimizer") for name in offloaded):
        terms["optimizer"] = trainable * _optimizer_bytes_per_param(candidate, param_bytes) / (
            card.bandwidth * BANDWIDTH_EFFICIENCY)
    terms.update(offloaded)
    tensors = sum(t.count for t in trained)
    synced = OPS_PER_TENSOR_SYNCED + (OPS_PAGED_PREFETCH if (candidate.optim or "").startswith("paged_") else 0)
    terms["optimizer launch"] = (OPS_OPTIMIZER_PER_TENSOR * tensors if card.cpu else synced * tensors
                                 if synchronized_optimizer(candidate.optim) else OPS_OPTIMIZER_FOREACH
                                 ) * card.op_seconds
    if policy.offloads_activations:
        terms["activation offload"] = activation_offload_seconds(
            candidate, card, rows, shape.layers, shape.hidden, terms["forward"] / micro,
            (terms["backward"] + terms.get("recompute", 0.0)) / micro)
    if candidate.ranks > 1:
        link = card.gpu_link * GPU_LINK_EFFICIENCY
        share = (candidate.ranks - 1) / candidate.ranks
        terms["gradient reduction"] = 2 * share * trainable * 2 / link
        if shards_parameters(candidate.sharding or zero_engine(candidate)):
            # every parameter is gathered for its module's pass, every expert's too
            stored_bytes = (counts.linear * stored + (counts.total - counts.linear) * bytes_per_weight if stored
                            else counts.total * bytes_per_weight)
            terms["parameter gathers"] = micro * passes * share * stored_bytes / link
    if candidate.is_rl:
        terms.update(_rl_terms(candidate, shape, card, active + head, weights, seq))
    elif holds_reference(candidate):  # a preference trainer's reference model, without gradients, every micro-batch
        terms["reference forward"] = micro * _pass_seconds(layers_forward + 2 * head * rows, weights, rows, card)
    elif candidate.precompute_ref:  # the same forward, once per row before training: its share of one step
        terms["reference precompute"] = micro * _pass_seconds(layers_forward + 2 * head * rows, weights, rows, card)
    terms = with_rung_speeds(terms, candidate, shape)  # a plugin rung's own effect (``RungBase.speed``)
    tokens = sequences_per_micro_batch(candidate) * seq * micro * candidate.ranks
    band, notes = speed_band(candidate)
    return SpeedEstimate(sum(terms.values()), tokens, band, terms, candidate.ranks, notes)


def _rl_terms(candidate: Candidate, shape: ModelShape, card: Card, params: float, weights: float, seq: int
              ) -> Dict[str, float]:
    """Generation (prefill, then one bandwidth-bound decode step per completion token for the whole generation
    batch) and the frozen reference model's forward where beta > 0. transformers' ``generate`` launches every
    operator of every layer at every decode step; vLLM replays each step as one CUDA graph over its paged KV cache
    (``VLLM_STEP_SECONDS`` of host time a step [A]) and takes the trainer's weights at every step (the sync: the
    weights read and written on the card, colocated; sent over the GPU link to the server's GPUs)."""
    batch = candidate.micro_batch * candidate.grad_accum  # the generation batch of one rank
    split = 1  # a server of autofit's placing: every rank's batch at once, over its tensor-parallel GPUs
    if candidate.vllm == "server" and candidate.vllm_server_gpus:
        batch, split = batch * candidate.ranks, candidate.vllm_server_gpus
    prompt = seq - candidate.max_length
    kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2  # bf16 keys and values
    context = prompt + candidate.max_length / 2  # on average over the decode
    decode_bytes = weights + batch * context * kv_per_token
    decode = _pass_seconds(2 * params * batch / split, decode_bytes / split, None, card)
    prefill = _pass_seconds(2 * params * batch * prompt / split, weights / split, batch * prompt / split, card)
    if candidate.vllm:
        sync = (2 * weights / (card.bandwidth * BANDWIDTH_EFFICIENCY) if candidate.vllm == "colocate"
                else weights / card.gpu_link)
        terms = {"vLLM generation": prefill + candidate.max_length * decode,
                 "vLLM steps": (1 + candidate.max_length) * VLLM_STEP_SECONDS, "vLLM weight sync": sync}
        if candidate.vllm_sleep and candidate.vllm == "colocate":
            terms["vLLM wake-up"] = VLLM_WAKE_SECONDS
    else:
        terms = {"generation": prefill + candidate.max_length * decode,
                 "generation launches": (1 + candidate.max_length) * OPS_FORWARD_PER_LAYER * shape.layers
                 * card.op_seconds}
    if _beta(candidate) > 0:
        terms["reference forward"] = _pass_seconds(2 * params * batch * seq, weights, batch * seq, card)
    return terms


def measured_rates_card(flops: float, bandwidth: float, op_seconds: float = CPU_OP_SECONDS,
                        half_rows: float = CPU_HALF_ROWS, elementwise_seconds: float = CPU_ELEMENTWISE_SECONDS,
                        *, name: str = "cpu") -> Card:
    """A card for this machine's own measured rates (``autofit.probe._rates``; the CPU meter): host and GPU links
    are its memory. ``flops`` is a large matmul's rate, which a matmul of ``half_rows`` rows reaches half of;
    ``op_seconds`` one operator of a model under the probe's meter; ``elementwise_seconds`` an element of an fp32
    pass over a tensor."""
    large = (1024 + half_rows) / 1024  # the measured matmul's own rows: its rate is a little below the plateau
    return Card(name, flops * large / GEMM_EFFICIENCY, bandwidth / BANDWIDTH_EFFICIENCY, bandwidth, bandwidth,
                "measured on this machine", half_rows=half_rows, op_seconds=op_seconds, cpu=True,
                elementwise_seconds=elementwise_seconds)


def calibrated_scale(pairs: Iterable[Tuple[float, float]]) -> Optional[float]:
    """One scale on predicted step times from (predicted, measured) seconds: their geometric mean ratio."""
    ratios = [measured / predicted for predicted, measured in pairs if predicted > 0 and measured > 0]
    if not ratios:
        return None
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))
