"""Several GPUs: each rank's share of the parameters' bytes under data parallel, DeepSpeed ZeRO 1-3 and FSDP2.

Activations, the LM head's buffers and generation are per rank already (each rank runs its own micro-batch); what
changes is ``parameters.state_bytes``' part. World size N, trainable parameters T, all parameters P, on CUDA under
TRL's ``bf16=True``:

- data parallel (DDP): the whole state on every rank, plus DDP's gradient buckets, a flat copy of every gradient
  (accelerate and the Trainer leave ``gradient_as_bucket_view`` off) [D: torch ``Reducer``];
- DeepSpeed casts the module to the training dtype (bf16) and keeps fp32 master weights and Adam states (12 B per
  trainable parameter) partitioned over N from ZeRO-1 on. From the first backward on (whatever N, one GPU included)
  it holds its gradients: ZeRO-1 whole bf16 gradients, ZeRO-2 and 3 a 1/N bf16 partition; the step adds the
  partition's fp32 copy. ZeRO-3 also partitions the bf16 weights, gathering a layer and the prefetch bucket for its
  forward and backward, at most ``stage3_max_live_parameters``. The reduce buckets live by phase
  (``zero_phase_buffers``), their sizes the engine's own settings (``_engine_settings``: the user's DeepSpeed
  configuration or autofit's) [D: DeepSpeed 0.19 ``stage_1_and_2.py`` ``copy_grads_in_partition``/``setup_buckets``,
  ``stage3.py``];
- FSDP2 full shard keeps every parameter, its gradient and AdamW's states sharded in the loaded dtype (float32: 16 B
  per trainable parameter over N), and unshards a layer in bf16 for its compute, the next one prefetched
  [D: torch ``fully_shard`` with accelerate's mixed-precision policy]. Under gradient accumulation the Trainer runs
  every micro-batch but the last in accelerate's ``no_sync``, which for FSDP2 turns gradient sync off: the gradients
  then accumulate unsharded, whole in the compute dtype, until the last micro-batch reduce-scatters them
  [V: CPU meter, 2 gloo ranks under ``autofit.rungs.engines._probe_fsdp``, tiny-qwen2: 123.1 MiB per rank measured at
  accumulation 4 where the sharded gradients alone predicted 109.4].

NCCL's own buffers, outside PyTorch's allocator, are the ledger's (``_engine_settings.nccl_bytes``).

The offload variants keep the shards on the host: ``fsdp2-offload`` every parameter, gradient and AdamW state
(the step runs on the CPU), ``zero3-offload`` the bf16 weights' partitions, the fp32 master weights, gradients and
Adam states; the GPU holds the gathered layers and the reduction bucket (``zero_phase_buffers``). The host figure
is the machine's: all of its ranks' shards.

A reference model (GRPO/RLOO with beta > 0) is sharded by ZeRO-3 and FSDP2 (TRL prepares it with the engine), whole
otherwise. DeepSpeed is measured only at world size 1 on the CPU (accelerate runs it across processes only on
GPUs); FSDP2 full shard runs across CPU ranks under ``autofit.rungs.engines._probe_fsdp``. The rest is derived, for
``autofit estimate --gpus N`` and the search's predicted starts [D].
"""

from __future__ import annotations

import dataclasses
from typing import Dict

from autofit.core import DDP, ENGINES, Candidate
from autofit.memory_model._engine_settings import ZeroSettings, buckets_before_backward, zero_engine, zero_settings
from autofit.memory_model._parameters import StateBytes, compute_bytes, param_counts, trainable_tensors, weight_bytes
from autofit.memory_model._shape import ModelShape

OFFLOADED = tuple(name for name, engine in ENGINES.items() if engine.sharding and engine.offloads_parameters)
FSDP_ENGINES = tuple(name for name, engine in ENGINES.items() if engine.fsdp)
ZERO_HOST_FP32_BYTES = 4 + 4 + 8  # fp32 master weight, its gradient, Adam's two states
DDP_BUCKET_COPIES = 1  # a flat copy of every gradient
ZERO_MASTER_AND_ADAM_BYTES = 4 + 8  # fp32 master weight, exp_avg, exp_avg_sq
# The partition's gradient flattened to fp32 for the step (a copy even of an fp32 module's) [V: CPU meter, a ZeRO-2
# config of the user's on tiny-qwen2 at 16 tokens, the step the peak: 129.79 MiB measured, 133.6 predicted]
ZERO_FP32_GRAD_BYTES = 4
UNSHARDED_LAYERS = 2  # the layer being computed and the one prefetched (ZeRO-3 and FSDP2)
ADAMW_STATE_COPIES = 2
ZERO_PHASES = ("train", "backward", "first_backward", "step", "generation")


def _layer_params(shape: ModelShape, candidate: Candidate) -> float:
    counts = param_counts(shape, candidate.algo)
    return (counts.total - counts.embedding - counts.lm_head) / max(shape.layers, 1)


def sharded_state(state: StateBytes, candidate: Candidate, shape: ModelShape, device: str) -> StateBytes:
    """One rank's share of ``state`` (a single GPU's) under the candidate's engine across ``candidate.ranks``."""
    ranks = candidate.ranks
    strategy = candidate.sharding or zero_engine(candidate) or DDP
    if (ranks < 2 and strategy == DDP) or candidate.optimizer_offload:  # a named engine on one GPU is its own
        return state
    if strategy in OFFLOADED:
        return _offloaded(state, candidate, shape, device, strategy)
    if strategy == DDP:
        return dataclasses.replace(state, gradients=state.gradients * (1 + DDP_BUCKET_COPIES))
    trainable = sum(t.numel * t.count for t in trainable_tensors(shape, candidate))
    frozen_weights = max(state.weights - trainable * state.trainable_bytes, 0.0)
    c_bytes = compute_bytes(candidate, shape, device)
    layer = _layer_params(shape, candidate)
    reference = state.reference
    if strategy in FSDP_ENGINES:
        w_bytes = weight_bytes(candidate, shape)
        unsharded = UNSHARDED_LAYERS * layer * c_bytes
        gradients = trainable * (c_bytes if candidate.grad_accum >= 2 else w_bytes / ranks) + layer * c_bytes
        return dataclasses.replace(
            state, weights=frozen_weights / ranks + trainable * w_bytes / ranks + unsharded, autocast_copy=0.0,
            gradients=gradients,
            optimizer=ADAMW_STATE_COPIES * trainable * w_bytes / ranks,
            step_temporaries=state.step_temporaries / ranks, embedding_temporaries=0.0, reference=reference / ranks)
    # DeepSpeed ZeRO: the module in the training dtype, master weights and Adam states partitioned
    settings = zero_settings(candidate, shape)
    engine = c_bytes if device == "cuda" else weight_bytes(candidate, shape)  # on the CPU: the load dtype
    w_bytes = weight_bytes(candidate, shape)
    weights = frozen_weights * engine / w_bytes + trainable * engine  # DeepSpeed casts the whole module
    optimizer = ZERO_MASTER_AND_ADAM_BYTES * trainable / ranks
    gradients = trainable * engine / (1 if settings.stage == 1 else ranks)
    if settings.stage == 3:
        weights = weights / ranks + _gathered(layer, settings, param_counts(shape, candidate.algo).total) * engine
        reference = reference / ranks
    return dataclasses.replace(state, weights=weights, autocast_copy=0.0, gradients=gradients, optimizer=optimizer,
                               step_temporaries=state.step_temporaries / ranks, embedding_temporaries=0.0,
                               reference=reference, step_gradients=trainable * ZERO_FP32_GRAD_BYTES / ranks)


def _gathered(layer: float, settings: ZeroSettings, total: float) -> float:
    """Elements ZeRO-3 holds gathered: the layer computed, the next one and the prefetch bucket, at most
    ``stage3_max_live_parameters`` (never less than the layer computed) and never more than the model has (a
    prefetch bucket larger than the model fetches the model) [V: CPU meter, tiny-qwen2 (5.7M parameters) under
    DeepSpeed's default 5e7-element prefetch bucket: 542.72 MiB measured, 542.8 predicted, 717.5 uncapped]."""
    return min(UNSHARDED_LAYERS * layer + settings.prefetch_bucket, max(settings.max_live, layer), total)


def _offloaded(state: StateBytes, candidate: Candidate, shape: ModelShape, device: str, strategy: str) -> StateBytes:
    """The GPU's share under the offloading shardings: the gathered layers and their transients only."""
    c_bytes = compute_bytes(candidate, shape, device)
    layer = _layer_params(shape, candidate)
    if strategy in FSDP_ENGINES:
        return dataclasses.replace(state, weights=UNSHARDED_LAYERS * layer * c_bytes, autocast_copy=0.0,
                                   gradients=layer * c_bytes, optimizer=0.0, step_temporaries=0.0,
                                   embedding_temporaries=0.0, reference=state.reference / candidate.ranks)
    engine = c_bytes if device == "cuda" else weight_bytes(candidate, shape)
    settings = zero_settings(candidate, shape)
    gathered = _gathered(layer, settings, param_counts(shape, candidate.algo).total) * engine
    return dataclasses.replace(state, weights=gathered, autocast_copy=0.0, gradients=0.0, optimizer=0.0,
                               step_temporaries=0.0, embedding_temporaries=0.0,
                               reference=state.reference / candidate.ranks)


def zero_phase_buffers(candidate: Candidate, shape: ModelShape, device: str) -> Dict[str, float]:
    """The bytes of ZeRO's buffers that live in some ledger phases only (none for another engine): its reduce (ipg)
    buckets, and ZeRO-2's accumulated gradient partition beside a later micro-batch's backward.

    ZeRO-3 allocates its one bucket with the optimizer and never frees it: every phase. ZeRO-1/2 allocate theirs
    (two with ``overlap_comm``) at the backward's first gradient and free them at its end (ZeRO-1: at the end of
    the accumulation's last backward): the backward phases, not the step; the LM head's backward ("train") only
    where DeepSpeed allocates them before the loss's backward (before 0.17.2) or ZeRO-1 keeps them from the
    previous micro-batch. Under accumulation ZeRO-2 copies each backward's partition into an accumulator, so the
    next backward holds two [D: DeepSpeed 0.19 ``stage_1_and_2.py`` ``process_gradients``/``setup_buckets``,
    ``independent_gradient_partition_epilogue``/``_release_ipg_buffers``, ``stage3.py``
    ``_setup_for_real_optimizer``; V: CPU meter, tiny-qwen2, 1e6 against 1e8-element buckets: docs/decisions.md]."""
    offload = candidate.optimizer_offload  # ZeRO-2 with the optimizer on the host: its buckets are ZeRO-2's
    if zero_engine(candidate) is None and not offload:
        return {}
    settings = zero_settings(candidate, shape)
    engine = compute_bytes(candidate, shape, device) if device == "cuda" else weight_bytes(candidate, shape)
    held = settings.reduce_bucket * settings.reduce_buckets * engine
    if settings.stage == 3:
        return dict.fromkeys(ZERO_PHASES, held)
    in_head = buckets_before_backward() or (settings.stage == 1 and candidate.grad_accum >= 2)
    backward = held
    if settings.stage == 2 and candidate.grad_accum >= 2 and not offload:  # offload accumulates on the host
        backward += sum(t.numel * t.count for t in trainable_tensors(shape, candidate)) * engine / candidate.ranks
    return {"train": held if in_head else 0.0, "backward": backward, "first_backward": backward}


def sharding_host_bytes(candidate: Candidate, shape: ModelShape, device: str) -> float:
    """Host memory the offloading shardings take on this machine (every rank's shards)."""
    if candidate.ranks < 2 or candidate.sharding not in OFFLOADED or candidate.optimizer_offload:
        return 0.0
    total = param_counts(shape, candidate.algo).total
    trainable = sum(t.numel * t.count for t in trainable_tensors(shape, candidate))
    if candidate.sharding in FSDP_ENGINES:
        w_bytes = weight_bytes(candidate, shape)
        return total * w_bytes + trainable * w_bytes * (1 + ADAMW_STATE_COPIES)
    engine = compute_bytes(candidate, shape, device) if device == "cuda" else weight_bytes(candidate, shape)
    return total * engine + trainable * ZERO_HOST_FP32_BYTES
