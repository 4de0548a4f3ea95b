"""Liger's kernels: ``use_liger_kernel`` swaps a decoder's RMSNorm, SwiGLU MLP and RoPE for fused Triton kernels.

Same math, faster, and fewer saved activations: the fused RMSNorm keeps its input and one float per row where
transformers' keeps a float32 copy and the normalized tensor; the fused SwiGLU keeps the gate and up projections and
recomputes the activation in the backward pass. A free rung, climbed right after the allocator's. What the issue
hoped for first, no full-vocabulary logits, TRL 1.16 already has: its SFT, GRPO and RLOO trainers compute the loss
through their own fused LM head and turn Liger's fused cross-entropy off (``autofit.memory_model._logits`` counts that
head), so only the layer kernels are Liger's here.

Triton kernels need a GPU: on the CPU the rung is left out with a note (a ladder naming it gets the rung that probes
on the simulated device, for tests with a stand-in ``liger_kernel``). Where the package is missing it is left out
with a note too. A probe the kernels break is the rung's failure: the search goes on without them.
"""

import importlib.util
from typing import Optional

from autofit.core import TRL_KEYS, Candidate, ProbeResult, clip
from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import FREE, LadderState

LIGER_RUNG = "liger-kernels"  # the name of the Liger rung
# The cause of a probe that Liger's kernels broke (Triton not compiling, a model Liger patches nothing of): an
# INVALID result of the rung (``autofit.rungs._failures``), so the search goes on without them.
KERNEL_FAILURE = "kernel"


def liger_missing() -> Optional[str]:
    """Why the kernels cannot run here; None when the package is importable."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install 'trl-autofit[liger]')"
    return None


class LigerKernels(RungBase):
    name = LIGER_RUNG
    cost = FREE
    modelled = True
    probe_step = "autofit.rungs.liger._probe:LigerStep"
    help = "use_liger_kernel=True: Liger's fused RMSNorm, SwiGLU and RoPE kernels, fewer saved activations (CUDA)"
    trade_text = ("Liger's fused RMSNorm, SwiGLU and RoPE kernels: the same math in other kernels (results equal to "
                  "rounding), nothing traded; TRL 1.16 warns that use_liger_kernel goes in v2")
    knobs = ("liger",)
    knob_comment = ("liger-kernels: Liger's fused RMSNorm, SwiGLU and RoPE, the layer kernels only (same math; TRL's "
                    "fused LM head computes the loss)")

    def __init__(self, on_simulated_device: bool = False):
        # On the CPU Triton has no device to run on; only a ladder that names the rung probes it there (tests put a
        # stand-in package with the same saved-tensor contract on the path).
        self.on_simulated_device = on_simulated_device

    def unavailable(self, device: str) -> Optional[str]:
        """Why the rung cannot be probed here (it is then left out, with a note)."""
        if device == "cpu" and not self.on_simulated_device:
            return "Liger's kernels are Triton kernels for GPUs, not for the CPU"
        return liger_missing()

    def apply(self, state: LadderState):
        candidate = state.candidate
        if candidate.liger or not candidate.unit.liger:  # PPO's loop builds its own models
            return None
        if dict(candidate.user_args).get(TRL_KEYS.use_liger) is not None:
            return None  # the user decided, either way
        return state.with_rung(self, candidate_changes={"liger": True})


class KernelFailures:
    """Liger's kernels found not to run on this machine (``autofit.rungs._failures.FailedRungs``' Liger half): the
    first probe they broke is noted, and every later candidate is built without them."""

    def __init__(self) -> None:
        self.failed = False

    def observe(self, candidate: Candidate, result: ProbeResult) -> Optional[str]:
        """The note for the report when this result is the kernels' first failure."""
        if candidate.liger and result.cause == KERNEL_FAILURE and not self.failed:
            self.failed = True
            return (f"Liger's kernels could not run here ({clip(result.error, 200)}); the search went on without them "
                    "(use_liger_kernel off)")
        return None

    def runnable(self, candidate: Candidate) -> Candidate:
        """The candidate without Liger's kernels (and their rung) once they failed; as it is otherwise."""
        if self.failed and candidate.liger:
            return candidate.replace(liger=False, rungs=tuple(r for r in candidate.rungs if r != LIGER_RUNG))
        return candidate
