"""The meter a probe runs under, and what is read of it: the budget checked after a run whose generation was left to
vLLM, and the peaks and stats of a meter a failure may have broken (runs in the probe process)."""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

from autofit.core import Candidate, vllm_installed
from autofit.machine import others_bytes

# vLLM generating for GRPO/RLOO (``--use-vllm``): probed where installed, estimated where not (``autofit.search``).
GENERATION_PHASES = ("generation",)


def exempt_phases(candidate: Candidate) -> Tuple[str, ...]:
    """Phases a probe measures but does not hold against the budget: generation, when vLLM is estimated."""
    return GENERATION_PHASES if candidate.vllm and not vllm_installed() else ()


def vllm_reserved(candidate: Candidate) -> int:
    """The bytes of a colocated vLLM's share a probe adds to each phase it measures (its meter holds the trainer's
    tensors against the rest): where vLLM is estimated, and on the simulated device, whose vLLM (the CPU build) sizes
    its KV cache in host memory by whole GiB, not by a share of the card. On a GPU with vLLM installed the meter sees
    vLLM's share itself (one process): nothing is added."""
    if candidate.vllm != "colocate" or not candidate.vllm_share_bytes:
        return 0
    return candidate.vllm_share_bytes if candidate.device == "cpu" or not vllm_installed() else 0


def make_meter(candidate: Candidate, budget_bytes: Optional[int], host_aware: bool = False):
    """The meter of a probe; ``host_aware``: a probe step of the candidate keeps storages in host memory
    (``ProbeStep.keeps_host``), which the simulated device's meter tells apart."""
    if exempt_phases(candidate):  # vLLM estimated: the budget is checked after the run, without its phases
        budget_bytes = None
    elif budget_bytes is not None and vllm_reserved(candidate):  # the trainer's tensors beside vLLM's share
        budget_bytes = max(budget_bytes - vllm_reserved(candidate), 1)
    if candidate.device == "cpu":
        from autofit.probe._meters import SimulatedMeter

        return SimulatedMeter(budget_bytes, others=lambda: others_bytes("cpu"), host_aware=host_aware)
    from autofit.probe._meters import CudaMeter

    return CudaMeter(budget_bytes, device=int(os.environ.get("LOCAL_RANK", "0")),  # one GPU per rank
                     empty_after=exempt_phases(candidate))


def over_budget(peaks: Dict[str, int], budget_bytes: Optional[int]):
    """(phase, the out-of-memory error the device would have raised there) outside the exempt phases, checked after
    the run; None when the peaks fit."""
    import torch

    if budget_bytes is None or not peaks:
        return None
    phase, peak = max(peaks.items(), key=lambda item: item[1])
    if peak <= budget_bytes:
        return None
    return phase, torch.OutOfMemoryError(
        f"out of memory (checked after the run, generation left to vLLM): peak {peak / 2**20:.2f} MiB > budget "
        f"{budget_bytes / 2**20:.2f} MiB (phase {phase})")


def safe_peaks(meter) -> Dict[str, int]:
    try:
        return meter.peaks() if meter is not None else {}
    except Exception:  # noqa: BLE001 - a broken CUDA context cannot be read any more
        return {}


def safe_stats(meter) -> Dict:
    try:
        return meter.stats() if meter is not None else {}
    except Exception:  # noqa: BLE001 - as in safe_peaks: the stats are best effort
        return {}
