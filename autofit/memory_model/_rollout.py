"""PPO's ledger (TRL 0.29-1.12 ``PPOTrainer``, read in trl 1.12's ``trl/experimental/ppo/ppo_trainer.py``): four models
and a rollout whose logits outlive it.

What the trainer holds, and when:

- models: the policy (a causal LM, LoRA and quantization as the candidate says) and the value model (a sequence
  classifier on the same backbone, always fully trained: peft wraps only the policy) are trained together, one AdamW
  over both (``PolicyAndValueWrapper``); the reference (a frozen copy of the policy; none under LoRA, the adapter is
  disabled instead) and the reward model (a frozen sequence classifier) only score. The built-in factory loads them
  with ``from_pretrained`` in the checkpoint's dtype (PPOConfig has no ``model_init_kwargs``).
- generation: ``batch_generation`` generates the local batch (micro-batch x accumulation) in chunks of
  ``local_rollout_forward_batch_size`` with ``output_scores=True``: every step's logits in float32 ([chunk, V] per
  token), stacked per chunk, then padded into one [batch, response, V] tensor. That tensor (``logitss``) is a local of
  the training loop: it lives until the next update's generation has returned, so the previous update's is still
  there while the next one generates and pads (the steady state a probe's second update shows).
- scoring, per chunk and without gradients: the reference's and the value model's forwards over prompt + response
  (full [chunk, T, V] logits and every layer's hidden state, ``output_hidden_states=True``), the reward model's.
- training, per micro-batch: the value backbone then the policy forward with gradients; ``output`` keeps the policy's
  full [mb, T, V] logits until the mini-batch ends; ``selective_log_softmax`` over the response slice, whose backward
  materializes a few [mb, response, V] float32 gradients and the full-size gradient of the sliced logits; after the
  step, the entropy's ``prob_dist`` ([mb, response, V], float32) stays until the next micro-batch's is computed.

Coefficients marked [V] were measured on the CPU meter with tiny-qwen2 (tests/scenarios/test_ppo_integration.py); on a
GPU the bf16 path of ``selective_log_softmax`` differs in detail [A].
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from autofit.core import Candidate
from autofit.memory_model._activations import DEFAULT_PROMPT_LENGTH, activation_bytes
from autofit.memory_model._logits import (
    GEN_LOGITS_BYTES,
    GEN_LOGITS_COPIES,
    GEN_PREFILL_HIDDEN_COPIES,
    GEN_PREFILL_MLP_COPIES,
    kv_cache_bytes,
)
from autofit.memory_model._parameters import compute_bytes, state_bytes
from autofit.memory_model._shape import ModelShape

# PPOConfig's rollout chunk and its default (trl-facts table: ``local_rollout_forward_batch_size=64``).
ROLLOUT_CHUNK_FIELD = "local_rollout_forward_batch_size"
TRL_ROLLOUT_CHUNK = 64
# generate(output_scores=True) keeps each step's processed logits in float32 [V code: transformers' generation loop
# copies the last position's logits ``.to(float32)``].
SCORE_BYTES = 4
# The rollout's logits at the padding of ``batch_generation``: the previous update's, the chunks' list and the padded
# copy [V: CPU meter, tiny-qwen2, 49.6 MiB over the static terms for 3 x 16 MiB].
PAD_ROLLOUT_COPIES = 3
# The policy's LM head at its backward: its output (kept by ``output``) and the full-size gradient of the sliced logits,
# in the compute dtype, per (token x vocab) element of prompt + response ...
TRAIN_FULL_LOGIT_COPIES = 2
# ... and float32 [mb, response, V] tensors of selective_log_softmax's backward (gather's scatter, logsumexp's per-row
# gradients and their stack, the division's) [V: CPU meter, tiny-qwen2: 4 copies at 4x48 and 4x96 tokens, within 1 %].
TRAIN_RESPONSE_LOGIT_COPIES = 4
# The entropy's float32 ``prob_dist`` of the previous micro-batch, alive through the next one's forward and backward.
PROB_DIST_BYTES = 4
# A no-grad forward keeps every layer's hidden state (``output_hidden_states=True``), the final one included.
HIDDEN_STATES_EXTRA = 1


def rollout_chunk(candidate: Candidate) -> int:
    """Sequences generated and scored at once: ``local_rollout_forward_batch_size``, at most the local batch."""
    given = dict(candidate.user_args).get(ROLLOUT_CHUNK_FIELD)
    chunk = int(given) if isinstance(given, int) and given > 0 else TRL_ROLLOUT_CHUNK
    return min(chunk, local_batch(candidate))


def local_batch(candidate: Candidate) -> int:
    """The rollout's batch on each rank: micro-batch x accumulation (``args.local_batch_size``)."""
    return candidate.micro_batch * candidate.grad_accum


def rollout_phases(candidate: Candidate, shape: ModelShape, device: str) -> List[Tuple[str, Dict[str, float]]]:
    """(phase, terms) of a PPO update at its steady state (the second update: the optimizer's states exist)."""
    act = compute_bytes(candidate, shape, device)
    policy = state_bytes(candidate, shape, device)
    critic = candidate.replace(algo=candidate.unit.critic, lora=None)
    value = state_bytes(critic.replace(quantization=None), shape, device)  # never quantized, never adapted
    reward = state_bytes(critic, shape, device).weights  # loaded as the policy is (quantization included)
    reference = 0.0 if candidate.lora is not None else state_bytes(candidate.replace(lora=None), shape, device).weights
    weights = policy.weights + policy.autocast_copy + value.weights + value.autocast_copy
    optimizer = policy.optimizer + value.optimizer
    gradients = policy.gradients + value.gradients
    resident = gradients if candidate.grad_accum >= 2 else 0.0  # accelerate accumulates: the step only at the last
    static = {"weights": weights, "reference": reference + reward, "optimizer": optimizer}

    batch, chunk, mb = local_batch(candidate), rollout_chunk(candidate), candidate.micro_batch
    prompt = candidate.prompt_length or DEFAULT_PROMPT_LENGTH
    response, tokens = candidate.max_length, prompt + candidate.max_length
    vocab = shape.vocab
    rollout = batch * response * vocab * SCORE_BYTES  # one update's rollout logits
    prev_prob = mb * response * vocab * PROB_DIST_BYTES if candidate.grad_accum >= 2 else 0.0
    output_logits = mb * tokens * vocab * act

    generating = (2 * rollout + kv_cache_bytes(shape, chunk, tokens, act)
                  + chunk * vocab * GEN_LOGITS_BYTES * GEN_LOGITS_COPIES
                  + chunk * prompt * act * (GEN_PREFILL_MLP_COPIES * shape.intermediate
                                            + GEN_PREFILL_HIDDEN_COPIES * shape.hidden))
    forward = chunk * tokens * (vocab + (shape.layers + HIDDEN_STATES_EXTRA) * shape.hidden) * act + \
        chunk * tokens * act * (GEN_PREFILL_MLP_COPIES * shape.intermediate + GEN_PREFILL_HIDDEN_COPIES * shape.hidden)
    scoring = max(PAD_ROLLOUT_COPIES * rollout, rollout + forward)

    policy_saved, policy_layer = activation_bytes(candidate, shape, act)
    value_saved, _ = activation_bytes(critic.replace(quantization=None), shape, act)
    head = TRAIN_FULL_LOGIT_COPIES * output_logits + TRAIN_RESPONSE_LOGIT_COPIES * mb * response * vocab * SCORE_BYTES
    return [
        ("generation", {**static, "generation": generating}),
        ("scoring", {**static, "generation": scoring}),
        ("train", {**static, "gradients": resident, "generation": rollout, "activations": policy_saved + value_saved,
                   "logits": head + prev_prob}),
        ("backward", {**static, "gradients": resident, "generation": rollout,
                      "activations": policy_layer + value_saved, "logits": output_logits + prev_prob}),
        ("step", {"weights": policy.weights + value.weights, "reference": reference + reward,
                  "gradients": gradients + policy.step_gradients + value.step_gradients,
                  "optimizer": optimizer + max(policy.step_temporaries + value.step_temporaries,
                                               policy.embedding_temporaries + value.embedding_temporaries),
                  "generation": rollout, "logits": output_logits + prev_prob}),
    ]
