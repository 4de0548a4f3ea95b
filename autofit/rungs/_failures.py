"""Rungs that cannot run on this machine, found out by probing: the search goes on without them.

A rung whose machinery fails (the offload engine does not build or start, Liger's kernels do not compile or patch
nothing) is not the machine's fault and not the search's end: its probe comes back INVALID with a cause
(``ENGINE_FAILURE``, declared here, ``KERNEL_FAILURE``, Liger's own), the search notes it once, probes no other
candidate of the offload engine, and builds every later candidate without Liger's kernels (a free rung at the foot
of the ladder: every level above it carries it; ``autofit.rungs.liger._rung.KernelFailures``).
"""

from __future__ import annotations

from typing import Optional

from autofit.core import Candidate, ProbeResult, clip
from autofit.rungs.liger._rung import KernelFailures

# The cause of a probe that failed under the optimizer-offload engine (DeepSpeed not building or starting): an
# INVALID result of that rung, so the search leaves the rung and goes on instead of calling the machine broken.
ENGINE_FAILURE = "engine"


class FailedRungs:
    def __init__(self) -> None:
        self.engine = False  # the offload engine could not run here: its other candidates are not probed
        self.liger = KernelFailures()  # Liger's kernels could not run here: later candidates go without them

    def observe(self, candidate: Candidate, result: ProbeResult) -> Optional[str]:
        """The note for the report when this result is the first failure of a rung's machinery."""
        if candidate.optimizer_offload and result.cause == ENGINE_FAILURE and not self.engine:
            self.engine = True
            return (f"optimizer offload could not run here ({clip(result.error, 200)}); its other candidates were not "
                    "probed")
        return self.liger.observe(candidate, result)

    def skipped(self, candidate: Candidate) -> bool:
        """Not worth a probe: its engine failed already."""
        return candidate.optimizer_offload and self.engine

    def runnable(self, candidate: Candidate) -> Candidate:
        """The candidate as this machine can run it: without Liger's kernels once they failed."""
        return self.liger.runnable(candidate)
