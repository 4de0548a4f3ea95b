"""What the device holds beyond tensors: the CUDA context and the caching allocator's overhead (memory-facts
2.7, 4.1, 5.1)."""

from __future__ import annotations

from autofit.core import Candidate
from autofit.rungs import allocator_options

GiB = 2**30

# 2.7 / 5.1: CUDA context prior 0.5 GB (0.3-0.6 GB with lazy loading); the CUDA meter measures it into the peak.
CUDA_CONTEXT_BYTES = GiB // 2
# 5.1: reserved/allocated ratio ρ ≈ 1.00-1.15, prior 1.05 (caching allocator rounding, fragmentation). Expandable
# segments avoid most of the slivers (4.2) [V concept]; 1.02 with them is an assumption [A]. The CPU meter counts
# live storages exactly: 1.0.
RESERVED_FACTOR = 1.05
RESERVED_FACTOR_EXPANDABLE = 1.02


def reserved_factor(candidate: Candidate, device: str) -> float:
    if device != "cuda":
        return 1.0
    if "expandable_segments:True" in allocator_options(dict(candidate.env)):
        return RESERVED_FACTOR_EXPANDABLE
    return RESERVED_FACTOR


def context_bytes(device: str) -> int:
    return CUDA_CONTEXT_BYTES if device == "cuda" else 0
