"""Optimizer offload (DeepSpeed ZeRO-2, ``offload_optimizer: cpu``): what stays on the device, what goes to the host.

Device: the weights in DeepSpeed's training dtype (bf16 on CUDA under TRL's ``bf16=True``: DeepSpeed casts the
module, whatever dtype TRL loaded; the weights' own dtype on the CPU), one gradient staging buffer of the largest
trainable tensor, and in the backward the reduction bucket (``_sharding.zero_phase_buffers``). No optimizer states, no
resident gradients, no autocast copies. Host, per trainable parameter: fp32 master weight, its gradient and two
Adam states (16 B), an fp32 accumulation buffer when the step accumulates micro-batches (4 B), and a pinned copy of
the weights in the device dtype plus a staging buffer of the largest tensor's gradient. Checked against the
storages DeepSpeed 0.19 holds after a probe (``autofit.rungs.engines._probe``) on the CPU meter.
"""

from __future__ import annotations

from autofit.core import Candidate
from autofit.memory_model._parameters import (
    TIED_EMBEDDING_GRAD_COPIES,
    StateBytes,
    _beta,
    compute_bytes,
    param_counts,
    trainable_tensors,
    weight_bytes,
)
from autofit.memory_model._shape import ModelShape

HOST_FP32_BYTES_PER_PARAM = 4 + 4 + 8  # master weight, its gradient, exp_avg and exp_avg_sq
HOST_ACCUMULATION_BYTES_PER_PARAM = 4
MASTER_BYTES = 4
# On the CPU, DeepSpeed's "move to CPU before flattening" is a no-op, so the original weights and their flat copy
# coexist while the engine starts (on a GPU the originals wait in host memory) [V: CPU meter, tiny-qwen2].
CPU_FLATTEN_COPIES = 2
NORM_COPY_BYTES_CUDA, NORM_COPY_BYTES_CPU = 4, 8


def engine_bytes(candidate: Candidate, shape: ModelShape, device: str) -> float:
    """Bytes per weight element on the device under the engine."""
    return compute_bytes(candidate, shape, device) if device == "cuda" else weight_bytes(candidate, shape)


def largest_trainable(shape: ModelShape, candidate: Candidate) -> int:
    return max((t.numel for t in trainable_tensors(shape, candidate)), default=0)


def offloaded_state_bytes(candidate: Candidate, shape: ModelShape, device: str) -> StateBytes:
    """The device's share of the parameters' bytes under optimizer offload (``parameters.state_bytes``'s form)."""
    counts = param_counts(shape, candidate.algo)
    c_bytes = engine_bytes(candidate, shape, device)
    staging = largest_trainable(shape, candidate) * c_bytes
    embedding_temporaries = 0.0
    if shape.tied_embeddings and not candidate.unit.sequence_classifier:
        embedding_temporaries = TIED_EMBEDDING_GRAD_COPIES * counts.embedding * c_bytes
    reference = counts.total * c_bytes if candidate.is_rl and _beta(candidate) > 0 else 0.0
    return StateBytes(weights=counts.total * c_bytes, autocast_copy=0.0, gradients=staging, optimizer=0.0,
                      step_temporaries=0.0, embedding_temporaries=embedding_temporaries, reference=reference,
                      trainable_bytes=int(c_bytes))


def gradient_transient_bytes(candidate: Candidate, shape: ModelShape, device: str) -> float:
    """While the backward hands a gradient to the engine: a clone of it for the reduction and an upcast copy for its
    norm (float32 on CUDA; float64 on the CPU, where torch's norm accumulates in double) [V: CPU meter, DeepSpeed
    0.19 ``reduce_independent_p_g_buckets_and_remove_grads`` and ``set_norm_for_param_grad_in_gpu``]."""
    norm_copy = NORM_COPY_BYTES_CPU if device == "cpu" else NORM_COPY_BYTES_CUDA
    return largest_trainable(shape, candidate) * (engine_bytes(candidate, shape, device) + norm_copy)


def engine_setup_bytes(candidate: Candidate, shape: ModelShape, device: str) -> float:
    """The device while the engine flattens the weights into one buffer."""
    weights = param_counts(shape, candidate.algo).total * engine_bytes(candidate, shape, device)
    return weights * (CPU_FLATTEN_COPIES if device == "cpu" else 1)


def optimizer_host_bytes(candidate: Candidate, shape: ModelShape, device: str) -> float:
    """Host memory the engine holds (pinned on a GPU machine): what the machine's free RAM must cover (asked by the
    optimizer-offload rung's ``host_bytes`` where the candidate offloads)."""
    counts = param_counts(shape, candidate.algo)
    per_param = HOST_FP32_BYTES_PER_PARAM + (HOST_ACCUMULATION_BYTES_PER_PARAM if candidate.grad_accum > 1 else 0)
    return (counts.total * per_param + counts.total * engine_bytes(candidate, shape, device)
            + largest_trainable(shape, candidate) * MASTER_BYTES)
