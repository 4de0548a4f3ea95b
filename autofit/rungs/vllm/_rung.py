"""vLLM's settings as rungs (GRPO and RLOO with ``--use-vllm colocate``): its context and its share of the card.

- ``vllm-context``: vLLM's ``max_model_len`` set to the run's prompt + completion. Left unset, TRL gives vLLM the
  model's whole context window, and vLLM refuses to start unless its KV cache holds one sequence of it (32,768 tokens
  for Qwen2.5): the most common reason a colocated vLLM does not start on a small card.
- ``vllm-share``: ``vllm_gpu_memory_utilization`` set to what vLLM needs to start and to hold TRL's batch at once
  (its weights, its profiling peak, non-torch memory, CUDA graphs, the KV cache of ``max_num_seqs`` sequences; the
  memory model's figure, handed in by ``LadderState.vllm_need``), with 10% to spare, in hundredths of the card: the
  trainer has the rest. Users tune the share by running their job several times; this is that tuning, by the ledger
  and then by the probes.

Both are free (the same math, the same speed where vLLM holds the batch); the search tries their levels as it tries
every free level, and keeps the fastest fit.

- ``vllm-sleep``: TRL's ``vllm_enable_sleep_mode``. vLLM sleeps at level 2 after each generation (its weights and KV
  cache released, nothing kept in host memory: TRL re-syncs the weights from the trainer) and wakes for the next, so
  the trainer's forward, backward and optimizer step have the card but for what vLLM keeps asleep (its non-torch
  memory and CUDA graphs); the generation holds the whole share beside the trainer's weights and optimizer states.
  A speed rung: the same training, each generation round waiting for vLLM to wake. vLLM's sleep mode is CUDA's only.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from autofit.core import TRL_KEYS, Candidate
from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import FREE, SPEED, LadderState

SPARE = 0.10  # of what vLLM needs, kept free in its share (its profiling run and CUDA graphs vary)
SHARES = (0.05, 0.95)  # the least and the most of the card the rung gives vLLM, in hundredths


class VllmContext(RungBase):
    name = "vllm-context"
    cost = FREE
    modelled = True
    help = "vllm_max_model_length = the run's prompt + completion, not the model's whole context"
    key_comments = {TRL_KEYS.vllm_context: name}
    priced_by_its_search = ("what it buys is vLLM's start where the model's whole window does not fit the share "
                            "(the ledger's refusal); a share that holds the window is priced the same")
    probe_step = "autofit.rungs.vllm._probe:VllmStep"

    def apply(self, state: LadderState) -> Optional[LadderState]:
        candidate = state.candidate
        if candidate.vllm is None or candidate.vllm_max_model_length:
            return None
        context = (candidate.prompt_length or 0) + candidate.max_length
        return state.with_rung(self, candidate_changes={"vllm_max_model_length": context})

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        return (f"vLLM's context is the run's {candidate.vllm_max_model_length} tokens (prompt + completion), not "
                "the model's whole window: its KV cache needs one such sequence to start; a longer prompt is refused "
                "by vLLM, so keep prompts as short as the probes'")


class VllmShare(RungBase):
    name = "vllm-share"
    cost = FREE
    modelled = True
    help = ("vllm_gpu_memory_utilization = what vLLM needs to start and hold TRL's batch (weights, profiling peak, "
            f"non-torch memory, CUDA graphs, KV cache), {SPARE:.0%} to spare: the trainer has the rest")
    key_comments = {TRL_KEYS.vllm_share: name}
    probe_step = "autofit.rungs.vllm._probe:VllmStep"

    def apply(self, state: LadderState) -> Optional[LadderState]:
        candidate = state.candidate
        if candidate.vllm != "colocate" or state.vllm_need is None or not candidate.vllm_share_bytes \
                or not candidate.vllm_utilization:
            return None
        card = candidate.vllm_share_bytes / candidate.vllm_utilization
        share = max(SHARES[0], math.ceil(100 * state.vllm_need(candidate) * (1 + SPARE) / card) / 100)
        if share > SHARES[1] or abs(share - candidate.vllm_utilization) < 0.005:
            return None  # vLLM cannot have enough of this card, or has what it needs already
        return state.with_rung(self, candidate_changes={"vllm_utilization": share,
                                                        "vllm_share_bytes": int(share * card)})

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        return (f"vLLM takes {candidate.vllm_utilization:.0%} of each GPU, what it needs to start and hold TRL's "
                f"{candidate.micro_batch * candidate.grad_accum} sequences at once with {SPARE:.0%} to spare; the "
                "trainer has the rest (nothing about the training changes)")


class VllmSleep(RungBase):
    name = "vllm-sleep"
    cost = SPEED
    modelled = True
    help = ("vllm_enable_sleep_mode: vLLM's weights and KV cache released after each generation (TRL's sleep level 2), "
            "the trainer has the card while it trains")
    trade_text = ("vLLM sleeps between generations (TRL's vllm_enable_sleep_mode, level 2): its weights and KV cache "
                  "are released while the trainer trains and mapped again, the weights synced from the trainer, before "
                  "each generation; the same training, each generation round waiting for vLLM to wake")
    knobs = ("vllm_sleep",)
    knob_comment = "vllm-sleep: vLLM's weights and KV cache released outside generation (sleep level 2)"

    def __init__(self, on_simulated_device: bool = False):
        self.on_simulated_device = on_simulated_device

    def unavailable(self, device: str) -> Optional[str]:
        if device == "cpu" and not self.on_simulated_device:
            return "vLLM's sleep mode is CUDA's only (its CPU build has none)"
        return None

    def apply(self, state: LadderState) -> Optional[LadderState]:
        candidate = state.candidate
        if candidate.vllm != "colocate" or candidate.vllm_sleep:
            return None
        if dict(candidate.user_args).get(TRL_KEYS.vllm_sleep) is not None:
            return None  # the user decided, either way
        return state.with_rung(self, candidate_changes={"vllm_sleep": True})
