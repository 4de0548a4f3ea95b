"""The LM head and the loss (TRL's fused LM head) and the RL generation phase (KV cache, per-step logits):
memory-facts 2.5, 2.6 and trl-facts "fused LM head"."""

from __future__ import annotations

from autofit.core import Candidate
from autofit.memory_model._activations import DEFAULT_PROMPT_LENGTH, sequence_length
from autofit.memory_model._parameters import head_trained
from autofit.memory_model._shape import ModelShape

# trl-facts "Gotcha, fused LM head": TRL 1.16 SFT/GRPO/RLOO never build the full logits; the kernel allocates a
# [min(N, 4096), 32768] buffer in the compute dtype, in forward and again in backward [V code,
# trl/kernels/chunked_logprob.py]. Its backward accumulates the hidden-state gradient in fp32 [N, h] and, when the
# LM head is trained (full fine-tuning), the LM-head weight gradient in fp32 [V, h], cast at the end to the weight
# dtype (both alive for a moment) [V code].
FUSED_HEAD_TOKEN_CHUNK = 4096
FUSED_HEAD_VOCAB_CHUNK = 32768
FUSED_HEAD_GRAD_ACCUM_BYTES = 4
# Without Triton (the CPU), the kernel's torch fallback (``_backward_tile``) materializes whole-tile temporaries of
# [min(N, 4096), min(V, 32768)] live at its peak: 7 fp32 tensors (2 mul, 2 sub, exp, zeros_like, a cast) and a bool
# mask = 29 B per tile element [V: measured on the simulated meter, trl 1.16, tiny-qwen2: 463 MiB at 2044 x 8192].
FUSED_HEAD_TORCH_TILE_BYTES = 29
# gemma2's final logit softcapping (applied inside TRL's kernel): one more fp32 tile tensor in the torch fallback
# [V: measured on the CPU meter, tiny gemma2: +32 MiB at 1023 x 8192].
SOFTCAP_TILE_BYTES = 4

# 2.6: generation (HF generate) keeps the KV cache of the whole generation batch, and at each step the last
# position's logits: ``.to(float32, copy=True)`` + logits processors (min_new_tokens in probes) + softmax
# probabilities ≈ a few fp32 copies of [B_gen, V] [V code transformers generation/utils.py; count A].
GEN_LOGITS_BYTES = 4
GEN_LOGITS_COPIES = 4
# The prefill runs the prompts of the whole generation batch through one layer at a time without gradients: a few
# intermediate-size and hidden-size tensors per prompt token are live at once [A].
GEN_PREFILL_MLP_COPIES = 3
GEN_PREFILL_HIDDEN_COPIES = 4


def kv_cache_bytes(shape: ModelShape, batch: int, tokens: int, dtype_bytes: int) -> int:
    """2·L·n_kv·head_dim·tokens·batch·bytes (memory-facts 2.6). Sliding-window layers (gemma3) are counted at full
    length: an upper bound."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * tokens * batch * dtype_bytes


def fused_head_buffer_bytes(tokens: int, compute_bytes: int) -> int:
    """TRL's chunked LM-head matmul buffer: [min(tokens, 4096), 32768] in the compute dtype, whatever the vocab."""
    return min(tokens, FUSED_HEAD_TOKEN_CHUNK) * FUSED_HEAD_VOCAB_CHUNK * compute_bytes if tokens > 0 else 0


def logit_tokens(candidate: Candidate, device: str) -> int:
    """Positions the fused LM head scores: shifted labels; RL on CUDA scores only the completion (compact path),
    on the CPU every position (trl-facts). The reward model has no LM head."""
    if candidate.unit.sequence_classifier:
        return 0
    if candidate.is_rl and device == "cuda":
        return candidate.micro_batch * candidate.max_length
    # every row of the micro-batch: DPO's chosen and rejected sides are one forward of twice the rows
    return candidate.unit.sequences_per_example * candidate.micro_batch * (sequence_length(candidate) - 1)


def generation_batch(candidate: Candidate) -> int:
    """TRL: generation_batch_size = per_device_train_batch_size x steps_per_generation (default grad_accum)."""
    args = dict(candidate.user_args)
    if args.get("generation_batch_size"):
        return int(args["generation_batch_size"])
    return candidate.micro_batch * int(args.get("steps_per_generation") or candidate.grad_accum)


def logit_bytes(candidate: Candidate, shape: ModelShape, device: str, act_bytes: int, weight_bytes: int) -> float:
    """TRL's fused LM head at its backward: the matmul buffer, the fp32 hidden-state gradient, and when the head is
    trained its fp32 weight-gradient accumulator, with the cast at the end or (without Triton) the whole-tile
    temporaries of the torch fallback, whichever is larger."""
    n_logit = logit_tokens(candidate, device)
    if not n_logit:
        return 0.0
    logits = fused_head_buffer_bytes(n_logit, act_bytes)
    logits += n_logit * shape.hidden * FUSED_HEAD_GRAD_ACCUM_BYTES  # fp32 grad of the hidden states
    cast_copy = 0.0
    if head_trained(candidate):  # the LM head (or the tied embedding) is trained
        logits += shape.vocab * shape.hidden * FUSED_HEAD_GRAD_ACCUM_BYTES
        cast_copy = shape.vocab * shape.hidden * weight_bytes
    tile_temporaries = 0.0
    if device != "cuda":  # no Triton: the torch fallback's whole-tile temporaries (freed before the cast)
        tile = min(n_logit, FUSED_HEAD_TOKEN_CHUNK) * min(shape.vocab, FUSED_HEAD_VOCAB_CHUNK)
        tile_temporaries = tile * (FUSED_HEAD_TORCH_TILE_BYTES + (SOFTCAP_TILE_BYTES if shape.final_softcap else 0))
    return logits + max(tile_temporaries, cast_copy)


def generation_bytes(candidate: Candidate, shape: ModelShape, act_bytes: int) -> float:
    """The generation phase of GRPO/RLOO: the KV cache of the whole generation batch, the last position's logits
    (a few fp32 copies), and the prefill's intermediate tensors."""
    batch = generation_batch(candidate)
    prompt = candidate.prompt_length or DEFAULT_PROMPT_LENGTH
    generation = kv_cache_bytes(shape, batch, prompt + candidate.max_length, act_bytes)
    generation += batch * shape.vocab * GEN_LOGITS_BYTES * GEN_LOGITS_COPIES
    generation += batch * prompt * act_bytes * (
        GEN_PREFILL_MLP_COPIES * shape.intermediate + GEN_PREFILL_HIDDEN_COPIES * shape.hidden)
    return generation
