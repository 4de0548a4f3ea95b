"""The engines a probe runs under and the export writes (DeepSpeed ZeRO, FSDP2, data parallel), each declared once:
the only place their names are spelled (``tests/house/test_engine_spelling.py``). An engine is what it shards across
the ranks and keeps in host memory, its family (the accelerate config it runs under), its ZeRO stage and, for a
sharding rung (``Candidate.sharding``), its place in the ladder and its words; ``zero2-offload`` is the optimizer
offload's (``Candidate.offload``). The rungs' files, the launch, the memory model and the export ask these facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

DEEPSPEED, FSDP, NO_FAMILY = "deepspeed", "fsdp", "none"
DDP, ZERO1, ZERO2, ZERO3 = "ddp", "zero1", "zero2", "zero3"
ZERO2_OFFLOAD, ZERO3_OFFLOAD, FSDP2, FSDP2_OFFLOAD = "zero2-offload", "zero3-offload", "fsdp2", "fsdp2-offload"


@dataclass(frozen=True)
class Engine:
    name: str
    family: str  # DEEPSPEED, FSDP or NO_FAMILY (data parallel)
    stage: int = 0  # DeepSpeed's ZeRO stage
    shards_optimizer: bool = False  # the optimizer's states split across the ranks
    shards_gradients: bool = False
    shards_parameters: bool = False  # the weights too, each layer gathered for its pass
    offloads_optimizer: bool = False  # the optimizer's states (and its step) in host memory
    offloads_parameters: bool = False  # the parameters' shards in host memory too
    rung: int = 0  # its place among the sharding rungs (0: not one)
    help: str = ""  # the sharding rung's words

    @property
    def deepspeed(self) -> bool:
        return self.family == DEEPSPEED

    @property
    def fsdp(self) -> bool:
        return self.family == FSDP

    @property
    def sharding(self) -> bool:  # a sharding rung's (``Candidate.sharding``)
        return self.rung > 0

    @property
    def optimizer_offload(self) -> bool:  # the optimizer offload's (``Candidate.offload``)
        return self.offloads_optimizer and not self.sharding


_ALL = dict(shards_optimizer=True, shards_gradients=True, shards_parameters=True)
# In the order the engine files list them (``autofit.rungs.engines``)
ENGINES: Dict[str, Engine] = {engine.name: engine for engine in (
    Engine(ZERO2_OFFLOAD, DEEPSPEED, 2, shards_optimizer=True, shards_gradients=True, offloads_optimizer=True),
    Engine(ZERO1, DEEPSPEED, 1, shards_optimizer=True, rung=1,
           help="DeepSpeed ZeRO-1 across the GPUs: optimizer states sharded"),
    Engine(ZERO2, DEEPSPEED, 2, shards_optimizer=True, shards_gradients=True, rung=2,
           help="DeepSpeed ZeRO-2 across the GPUs: optimizer states and gradients sharded"),
    Engine(ZERO3, DEEPSPEED, 3, **_ALL, rung=4,
           help="DeepSpeed ZeRO-3 across the GPUs: weights, gradients and optimizer states sharded"),
    Engine(ZERO3_OFFLOAD, DEEPSPEED, 3, **_ALL, offloads_optimizer=True, offloads_parameters=True, rung=6,
           help="DeepSpeed ZeRO-3 with weights and optimizer states in host memory (offload_param/_optimizer)"),
    Engine(FSDP2, FSDP, **_ALL, rung=3,
           help="FSDP2 full shard across the GPUs: weights, gradients and optimizer states sharded"),
    Engine(FSDP2_OFFLOAD, FSDP, **_ALL, offloads_optimizer=True, offloads_parameters=True, rung=5,
           help="FSDP2 full shard with the shards in host memory (fsdp_offload_params)"),
    Engine(DDP, NO_FAMILY),
)}


def engine_of(name: Optional[str]) -> Optional[Engine]:
    """The registry's entry for ``name``; None for None, "" or a name it does not know."""
    return ENGINES.get(name) if name else None


def engine_for(stage: int = 0, optimizer: bool = False, parameters: bool = False, fsdp: bool = False) -> str:
    """The engine autofit names for a ZeRO ``stage`` (1-3) and what it offloads, or FSDP (``fsdp``; offloading its
    ``parameters``), as the ledger models it: ZeRO-1 or 2 offloading the optimizer is zero2-offload, ZeRO-3 offloading
    both zero3-offload, ZeRO-3 offloading one of them the stage's own; no stage and no FSDP: data parallel."""
    if fsdp:
        return FSDP2_OFFLOAD if parameters else FSDP2
    if stage in (1, 2) and optimizer:
        return ZERO2_OFFLOAD
    if stage == 3 and optimizer and parameters:
        return ZERO3_OFFLOAD
    return {1: ZERO1, 2: ZERO2, 3: ZERO3}.get(stage, DDP)
