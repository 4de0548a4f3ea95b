"""vLLM generating for GRPO/RLOO (``use_vllm``): its share of each GPU, from vLLM's own memory accounting.

vLLM takes ``gpu_memory_utilization`` of the GPU's total memory for itself and splits it, at start-up, into the
model's weights, the peak of a profiling run, and the KV cache: whatever is left [D: vLLM docs, "gpu_memory_utilization:
the fraction of GPU memory to be used for the model executor ... KV cache size is determined by the remaining memory
after the model weights and activations"]. It refuses to start when the KV cache cannot hold one sequence of
``max_model_len`` tokens, and queues sequences (slower, never an out-of-memory error) when it cannot hold the
batch's. TRL 1.16 (``grpo_trainer.py``) starts it with ``max_num_seqs`` = per-device batch x tensor parallel x
``steps_per_generation``, ``max_num_batched_tokens`` = 4096 and ``max_model_len`` = ``vllm_max_model_length``
(None: the model's ``max_position_embeddings``).

``colocate``: vLLM runs in each training process and reserves its share at its start, so the share is a term of every
phase of the candidate's ledger (``vllm_term``: the generation column), the trainer has the rest and does not generate
with transformers. ``server``: vLLM runs on other GPUs (``trl vllm-serve``); the trainer has the whole GPU and no
generation phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from autofit.core import DEFAULT_ALGO, Candidate
from autofit.memory_model._parameters import param_counts
from autofit.memory_model._shape import ModelShape

VLLM_MODES = ("colocate", "server")
TRL_DEFAULT_UTILIZATION = 0.3  # GRPOConfig.vllm_gpu_memory_utilization
TRL_MAX_NUM_BATCHED_TOKENS = 4096
VLLM_WEIGHT_BYTES = 2  # bf16
KV_BYTES = 2  # bf16 cache
# The profiling run's peak per batched token: the MLP's gate/up outputs and a few hidden-size tensors in bf16 [A];
# the sampler's fp32 logits for every sequence.
PROFILE_BYTES_PER_TOKEN_I, PROFILE_BYTES_PER_TOKEN_H = 2 * 2, 4 * 2
SAMPLER_LOGIT_BYTES = 4


@dataclass(frozen=True)
class VllmShare:
    share: float  # bytes vLLM takes of the GPU (colocate)
    weights: float
    profile_peak: float
    kv_cache: float  # what is left for the KV cache (negative: nothing)
    kv_per_token: float
    max_model_len: int
    start_tokens: int  # the KV cache vLLM needs to start: one sequence of max_model_len
    batch_tokens: int  # what TRL's batch needs at once: max_num_seqs sequences of prompt + completion

    @property
    def starts(self) -> bool:
        return self.kv_cache >= self.start_tokens * self.kv_per_token

    @property
    def holds_the_batch(self) -> bool:
        return self.kv_cache >= self.batch_tokens * self.kv_per_token


def vllm_share(shape: ModelShape, budget_bytes: int, utilization: float, max_num_seqs: int, sequence_tokens: int,
               max_model_len: Optional[int] = None, algo: str = DEFAULT_ALGO) -> VllmShare:
    """vLLM's colocated share of one GPU of ``budget_bytes`` (tensor parallel 1)."""
    share = utilization * budget_bytes
    weights = param_counts(shape, algo).total * VLLM_WEIGHT_BYTES
    profile = TRL_MAX_NUM_BATCHED_TOKENS * (PROFILE_BYTES_PER_TOKEN_I * shape.intermediate
                                            + PROFILE_BYTES_PER_TOKEN_H * shape.hidden) \
        + max_num_seqs * shape.vocab * SAMPLER_LOGIT_BYTES
    kv_per_token = 2 * shape.layers * shape.kv_dim * KV_BYTES  # K and V of every layer
    model_len = max_model_len or shape.max_positions or sequence_tokens
    return VllmShare(share=share, weights=weights, profile_peak=profile, kv_cache=share - weights - profile,
                     kv_per_token=kv_per_token, max_model_len=model_len, start_tokens=model_len,
                     batch_tokens=max_num_seqs * sequence_tokens)


def candidate_share(candidate: Candidate, shape: ModelShape) -> VllmShare:
    """vLLM's share of one GPU as the candidate runs it: its reserved bytes, TRL's ``max_num_seqs`` (the per-device
    batch x steps per generation), its context."""
    return vllm_share(shape, candidate.vllm_share_bytes or 0, 1.0,
                      max_num_seqs=candidate.micro_batch * candidate.grad_accum,
                      sequence_tokens=(candidate.prompt_length or 0) + candidate.max_length,
                      max_model_len=candidate.vllm_max_model_length, algo=candidate.algo)


def vllm_need(candidate: Candidate, shape: ModelShape) -> float:
    """The bytes vLLM needs of its share to start and to hold TRL's batch at once: its weights, its profiling peak, and
    a KV cache of one max_model_len sequence or of the batch, whichever is larger."""
    share = candidate_share(candidate, shape)
    return share.weights + share.profile_peak + max(share.start_tokens, share.batch_tokens) * share.kv_per_token


def vllm_term(candidate: Candidate, shape: ModelShape) -> float:
    """What a colocated vLLM holds of the card in every phase of the step: its share, reserved at its start; where the
    share cannot start it, what it would need (so that such a candidate is never predicted to fit)."""
    if candidate.vllm != "colocate" or not candidate.vllm_share_bytes:
        return 0.0
    share = candidate_share(candidate, shape)
    starts = share.weights + share.profile_peak + share.start_tokens * share.kv_per_token
    return float(max(candidate.vllm_share_bytes, starts))
