"""Activation offloading: TRL's ``activation_offloading`` keeps saved activations in host memory until the backward
pass needs them (SFT and reward models).

Same math, slower steps (copies over PCIe, overlapped with compute on their own stream): a speed rung. Climbed after
checkpointing, it offloads only the layer inputs checkpointing keeps; it also competes with checkpointing: once a
level with both fits, the level without checkpointing is probed too and kept when it fits and is faster
(``alternative_to``, ``autofit.search._pruning``), where the host has room for every layer's activations.
"""

from autofit.core import Candidate
from autofit.rungs._contract import ModelFacts, RungBase
from autofit.rungs._ladder import SPEED, LadderState


class ActivationOffload(RungBase):
    name = "activation-offload"
    cost = SPEED
    modelled = True
    probe_step = "autofit.rungs.activation_offload._probe:ActivationOffloadStep"
    help = "activation_offloading=True: saved activations wait in host memory for the backward pass (SFT, reward)"
    alternative_to = ("checkpointing",)
    host_memory = "offloaded activations"
    trade_text = ("activation offloading: saved activations wait in host memory for the backward pass, the same "
                  "math; slower steps where the copies do not overlap the compute, and pinned host RAM")
    knobs = ("activation_offload",)
    knob_comment = "activation-offload: saved activations wait in host memory for the backward pass"

    def __init__(self, on_simulated_device: bool = False):
        # On the CPU, host memory is the simulated device's own RAM: offloading frees nothing real there, so only a
        # ladder that names the rung probes it (TRL's code, its host copies counted as host memory).
        self.on_simulated_device = on_simulated_device

    def apply(self, state: LadderState):
        candidate = state.candidate
        if candidate.device == "cpu" and not self.on_simulated_device:
            return None
        if candidate.activation_offload or not candidate.unit.activation_offloading:  # a config field of theirs
            return None
        return state.with_rung(self, candidate_changes={"activation_offload": True})

    def host_bytes(self, candidate: Candidate, model: ModelFacts) -> float:
        return model.offloaded_activation_bytes if candidate.activation_offload else 0.0
