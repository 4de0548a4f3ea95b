"""Optimizer offload: DeepSpeed ZeRO-2 keeps fp32 master weights, gradients and Adam states in host memory.

Same math (mixed precision with fp32 master weights, DeepSpeed's CPU Adam), slower steps: a speed rung. It is a
full fine-tune's alternative to the quality rungs, not their companion: with LoRA or a quantized base the states
are a rounding error, an 8-bit optimizer cannot run in DeepSpeed's CPU Adam, and with bf16 weights DeepSpeed
already trains the device copy in bf16. So a quality rung climbed after it takes it off (``autofit.rungs._ladder``), and
the level without offload is what the quality rungs shrink.
"""

from typing import Any, Mapping, Optional

from autofit.core import ENGINES, Candidate
from autofit.rungs._contract import ModelFacts, RungBase
from autofit.rungs._ladder import OFFLOAD_RUNG, SPEED, LadderState, replacement_words
from autofit.rungs.engines import ZERO2_OFFLOAD, deepspeed_missing

OFFLOADING_ENGINES = tuple(name for name, engine in ENGINES.items() if engine.offloads_optimizer)


class OptimizerOffload(RungBase):
    name = OFFLOAD_RUNG
    cost = SPEED
    modelled = True
    probe_step = "autofit.rungs.engines._probe:EngineStep"
    help = "DeepSpeed ZeRO-2, optimizer states and fp32 master weights in host memory (accelerate config written)"
    trade_text = ("optimizer offload (DeepSpeed ZeRO-2): fp32 master weights, gradients and AdamW states in host "
                  "memory, the same math; slower steps and pinned host RAM")

    runs_an_engine = True  # its own DeepSpeed configuration: it replaces one of the user's (a quality level)
    host_memory = "offloaded states"

    def __init__(self, engine: str = ZERO2_OFFLOAD, on_simulated_device: bool = False):
        self.engine = engine
        # On the CPU, host memory is the simulated device's own RAM: offload frees nothing real there, so only a
        # ladder that names the rung probes it (its plumbing, with offloaded state counted as host memory).
        self.on_simulated_device = on_simulated_device

    def unavailable(self, device: str) -> Optional[str]:
        """Why the rung cannot be probed here (it is then left out, with a note)."""
        if device == "cpu" and not self.on_simulated_device:
            return None  # it does not apply there (``apply``): nothing is missing
        return deepspeed_missing()

    def apply(self, state: LadderState):
        candidate = state.candidate
        if candidate.device == "cpu" and not self.on_simulated_device:
            return None
        if candidate.offload or candidate.lora is not None or candidate.quantization is not None:
            return None
        if not candidate.unit.engine_offload or candidate.optim not in (None, "adamw_torch", "adamw_torch_fused"):
            return None  # PPO scripts build their own accelerator; DeepSpeed's CPU Adam replaces only AdamW
        if state.own_engine is not None:  # the user's launch runs its own engine: this one replaces it
            if state.own_engine in OFFLOADING_ENGINES or candidate.sharding in OFFLOADING_ENGINES:
                return None  # it offloads already
            kept = candidate.sharding if candidate.sharding in candidate.rungs else None  # a rung's, recorded as below
            return state.replacing_engine(self, offload=self.engine, sharding=kept)
        # with several GPUs ZeRO-2 offload is the engine across them (``Candidate.engine``); the sharding of the
        # level before stays recorded for the quality rungs, which take offload off again
        return state.with_rung(self, candidate_changes={"offload": self.engine})

    def host_bytes(self, candidate: Candidate, model: ModelFacts) -> float:
        return model.offloaded_optimizer_bytes if candidate.offload else 0.0

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        if candidate.replaces:
            return f"{replacement_words(candidate.replaces, 'DeepSpeed ZeRO-2 with the optimizer offloaded')}; " \
                   "fp32 master weights, gradients and AdamW states in host memory, the same math; slower steps and " \
                   "pinned host RAM"
        return self.trade_text
