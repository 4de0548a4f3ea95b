"""vLLM's server placement as a rung (GRPO and RLOO with ``--use-vllm colocate`` on several GPUs of one node).

``vllm-server``: ``trl vllm-serve`` on k of the node's N GPUs (its tensor parallel size k, data parallel 1), the
trainer on the other N - k with ``vllm_mode: server``. The trainer's GPUs hold no share of vLLM at all, at the price
of k GPUs that do not train: the same effective batch over fewer ranks (more accumulation), and each generation
round on the server while the trainer waits (TRL's server mode is synchronous: the main process sends the prompts,
the ranks wait for the completions [S: trl/generation/vllm_generation.py, VLLMGeneration.generate in server mode]).

k is the fewest GPUs from 1 up whose server starts and holds TRL's batch (the memory model's ``vllm_server_fits``,
handed in by ``LadderState``), with k a tensor parallel size vLLM takes for the model (it divides the attention heads,
and the KV heads divide it or it divides them [S: vllm/config/model.py, ModelConfig.verify_with_parallel_config]),
and N - k dividing the node's effective batch (TRL's generation batch stays divisible by ``num_generations``).

A speed rung, the speed class's last: tried where the colocated levels leave vLLM or the trainer no room; the quality
rungs climb on from the colocated level before it (``LadderState.colocated``), as they take optimizer offload off.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from autofit.core import TRL_KEYS, Candidate
from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import OFFLOAD_RUNG, SPEED, LadderState
from autofit.rungs._sharding import SHARDING_RUNGS

TENSOR_PARALLEL = (1, 2, 4, 8)  # the server's sizes tried, from the fewest GPUs up
COLOCATED_RUNGS = ("vllm-share", "vllm-sleep")  # what a colocated share needed, gone with it


def placements(candidate: Candidate, rank_batch: int) -> Iterator[Tuple[int, int, int]]:
    """(server GPUs, trainer ranks, each rank's batch) the node allows, the fewest server GPUs first (whether vLLM
    takes that tensor parallel size for the model is ``vllm_server_fits``'s to say)."""
    node = candidate.ranks
    batch = rank_batch * node
    for gpus in TENSOR_PARALLEL:
        trainers = node - gpus
        if trainers < 1:
            return
        if batch % trainers == 0:
            yield gpus, trainers, batch // trainers


class VllmServer(RungBase):
    name = "vllm-server"
    cost = SPEED
    modelled = True
    help = ("vllm_mode: server, trl vllm-serve on the fewest of the node's GPUs that hold it (its tensor parallel "
            "size), the trainer on the rest with the same effective batch")
    knobs = ("vllm", "batch")
    knob_comment = "vllm-server: vLLM on GPUs of its own (best.yaml's header), the trainer on the rest, batch kept"
    probe_step = "autofit.rungs.vllm._probe:VllmStep"

    def apply(self, state: LadderState) -> Optional[LadderState]:
        candidate = state.candidate
        if candidate.vllm != "colocate" or candidate.ranks < 2 or state.vllm_server_fits is None:
            return None
        if dict(candidate.user_args).get(TRL_KEYS.vllm_mode) is not None:
            return None  # the user's file chose the mode
        rank_batch = candidate.micro_batch * candidate.grad_accum
        for gpus, trainers, per_rank in placements(candidate, rank_batch):
            served = self._served(candidate, gpus, trainers, per_rank)
            if state.vllm_server_fits(served, gpus):
                rungs = tuple(r for r in served.rungs if r not in COLOCATED_RUNGS)
                placed = dataclasses.replace(state, candidate=served.replace(rungs=rungs), rank_batch=per_rank)
                return dataclasses.replace(placed.with_rung(self), colocated=state)
        return None

    @staticmethod
    def _served(candidate: Candidate, gpus: int, trainers: int, per_rank: int) -> Candidate:
        micro = candidate.micro_batch
        while per_rank % micro:
            micro -= 1
        changes: Dict[str, Any] = dict(vllm="server", vllm_server_gpus=gpus, vllm_utilization=None,
                                       vllm_share_bytes=None, vllm_sleep=False, ranks=trainers, micro_batch=micro,
                                       grad_accum=per_rank // micro)
        if trainers == 1 and candidate.sharding:  # one rank shards nothing
            changes["sharding"] = None
            changes["rungs"] = tuple(r for r in candidate.rungs if r not in SHARDING_RUNGS and r != OFFLOAD_RUNG)
            if OFFLOAD_RUNG in candidate.rungs:  # the optimizer offload goes with its rung
                changes["offload"] = None
        return candidate.replace(**changes)

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        gpus = candidate.vllm_server_gpus
        node = candidate.ranks + gpus
        return (f"vLLM served on {gpus} of the node's {node} GPUs (trl vllm-serve, tensor parallel {gpus}; the command "
                f"is in best.yaml's header), the trainer on the other {candidate.ranks}: the same effective batch with "
                "more accumulation, each generation round on the server while the trainer waits")
