"""Sharding across several GPUs (``--gpus N``): DeepSpeed ZeRO stages 1 to 3 and FSDP2 full shard, through accelerate.

With several ranks the base level is plain data parallel: every GPU holds the whole training state. Each sharding
rung splits more of it across the ranks, at the price of communication (same math, slower steps: speed rungs):
ZeRO-1 the optimizer states, ZeRO-2 the gradients too, FSDP2 and ZeRO-3 the weights as well (gathered one layer at a
time). The offload variants, after optimizer offload in the default ladder, also keep the shards in host memory:
FSDP2 with ``fsdp_offload_params`` (weights, gradients and AdamW states on the host, the step on the CPU), ZeRO-3
with ``offload_param`` and ``offload_optimizer`` (DeepSpeed's CPU Adam). A rung replaces the sharding (and the
optimizer offload) of the level before it; among the fits of the speed class, throughput decides. On one GPU they
do not apply. Where the user's launch runs its own engine, one that shards more replaces it as a quality level
(``autofit.rungs._ladder``), its trade said.
"""

import dataclasses
from typing import Any, Mapping, Optional

from autofit.core import ENGINES, Candidate, engine_for
from autofit.rungs._contract import ModelFacts, RungBase
from autofit.rungs._ladder import OFFLOAD_RUNG, SPEED, LadderState, replacement_words
from autofit.rungs.engines import ZERO2_OFFLOAD, ZERO_STAGES, deepspeed_missing

# the registry's sharding engines, in the ladder's order (the more a rung shards, the later)
SHARDING_RUNGS = tuple(engine.name for engine in sorted((e for e in ENGINES.values() if e.sharding),
                                                        key=lambda e: e.rung))
OFFLOADING = tuple(name for name in SHARDING_RUNGS if ENGINES[name].offloads_parameters)
HELP = {name: ENGINES[name].help for name in SHARDING_RUNGS}
# what the user trades (best.json's trades): the same math, and the time the GPUs spend exchanging shards
COSTS = {name: "the same math, slower steps (the GPUs exchange the shards"
         + (", copied to and from the host), and pinned host RAM" if name in OFFLOADING else ")")
         for name in SHARDING_RUNGS}
TRADES = {name: f"{HELP[name]}; {COSTS[name]}" for name in SHARDING_RUNGS}
# accelerate sets up DeepSpeed and FSDP with several processes only on an accelerator: on a CPU-only machine its
# state counts one process under DeepSpeed (the batch checks fail) and keeps FSDP's ranks data parallel. FSDP2 full
# shard runs there under autofit.rungs.engines._probe_fsdp; its host offload (pinned shards) and DeepSpeed do not.
ON_THE_CPU = engine_for(fsdp=True)
CPU_REASON = ("accelerate runs DeepSpeed and FSDP's offload across several processes only on GPUs (on the CPU: data "
              "parallel and FSDP2)")


class Sharding(RungBase):
    cost = SPEED
    modelled = True
    probe_step = "autofit.rungs.engines._probe:EngineStep"

    runs_an_engine = True  # its own DeepSpeed or FSDP configuration: it replaces one of the user's (a quality level)

    def __init__(self, name: str):
        if name not in SHARDING_RUNGS:
            raise ValueError(f"unknown sharding '{name}': accepted are {', '.join(SHARDING_RUNGS)}")
        self.name = name
        self.help = HELP[name]
        self.trade_text = TRADES[name]
        self.host_memory = "offloaded shards" if name in OFFLOADING else ""

    def unavailable(self, device: str) -> Optional[str]:
        if device == "cpu" and self.name != ON_THE_CPU:
            return CPU_REASON
        return deepspeed_missing() if self.name in ZERO_STAGES else None

    def apply(self, state: LadderState):
        candidate = state.candidate
        if candidate.ranks < 2 or candidate.quantization is not None:
            return None  # one GPU; bitsandbytes weights do not shard here
        # the engine it would follow: a rung's, the launch's, or a deepspeed: block's (not on the candidate's fields)
        current = candidate.named_engine or (state.own_engine if not candidate.replaces else None)
        if current == ZERO2_OFFLOAD and self.name not in OFFLOADING:
            return None  # optimizer offload is its own engine; only an offloading sharding replaces it
        if current == self.name or _rank(current) > _rank(self.name):
            return None
        earlier = tuple(r for r in candidate.rungs if r not in SHARDING_RUNGS and r != OFFLOAD_RUNG)
        state = dataclasses.replace(state, candidate=candidate.replace(rungs=earlier, offload=None))
        if state.own_engine is not None:  # the user's launch runs its own engine: this one replaces it
            return state.replacing_engine(self, sharding=self.name)
        return state.with_rung(self, candidate_changes={"sharding": self.name})

    def host_bytes(self, candidate: Candidate, model: ModelFacts) -> float:
        return model.offloaded_shard_bytes if self.host_memory and candidate.sharding == self.name else 0.0

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        if candidate.replaces:
            return f"{replacement_words(candidate.replaces, HELP[self.name])}; {COSTS[self.name]}"
        return self.trade_text


def _rank(name: Optional[str]) -> int:
    return SHARDING_RUNGS.index(name) + 1 if name in SHARDING_RUNGS else 0

