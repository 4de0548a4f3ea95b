"""The other processes on the device: a busy GPU is noticed before probing, and a probe that ran out of memory while
another process grew is not the candidate's answer.

On CUDA they are read through NVML (the search's own process never initializes CUDA). The simulated device of the
CPU meter has no other process; a test, or a user trying the behaviour, can give it one: the file named by
``AUTOFIT_SIMULATED_OTHERS_FILE`` holds the bytes "another process" uses on the simulated device, optionally
followed by the Unix time until which it holds them (read again while probes run, so it can grow in the middle of one
and let go later).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from autofit.core import format_size

log = logging.getLogger(__name__)

SIMULATED_OTHERS_ENV = "AUTOFIT_SIMULATED_OTHERS_FILE"
# An OOM is "disturbed" when the other processes grew by more than this during the probe; it runs again after a
# pause that lets a passing spike of another process end.
DISTURBANCE_BYTES = 64 * 2**20
DISTURBED_RETRY_WAIT_S = 5.0


@dataclass(frozen=True)
class OtherProcess:
    pid: int
    name: str
    bytes: int

    def describe(self) -> str:
        return f"pid {self.pid} ({self.name}) holds {format_size(self.bytes)}"


def _simulated() -> Optional[int]:
    path = os.environ.get(SIMULATED_OTHERS_ENV)
    if not path:
        return None
    try:
        fields = open(path).read().split()
        held = max(0, int(float(fields[0]))) if fields else 0
        if len(fields) > 1 and time.time() > float(fields[1]):
            return 0  # let go
        return held
    except (OSError, ValueError):
        return 0


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return "?"


def other_processes(device: str, exclude: Tuple[int, ...] = (), rank: Optional[int] = None) -> List[OtherProcess]:
    """Processes other than this one (and ``exclude``) holding memory on the device (``rank``'s GPU: default, this
    process's)."""
    if device != "cuda":
        simulated = _simulated()
        return [OtherProcess(0, "simulated other process", simulated)] if simulated else []
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(rank))
        running = list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        running += list(pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
    except Exception as exc:  # noqa: BLE001 - no NVML (any of its errors): nothing can be said
        log.debug("NVML process list unavailable: %s", exc)
        return []
    skip = {os.getpid(), *exclude}
    return [OtherProcess(p.pid, _process_name(p.pid), int(p.usedGpuMemory or 0)) for p in running if p.pid not in skip]


def others_bytes(device: str) -> int:
    return sum(p.bytes for p in other_processes(device))


def free_bytes(device: str, budget_bytes: Optional[int], rank: Optional[int] = None) -> Optional[int]:
    """Memory free for the search: NVML's free memory of the card (``rank``'s GPU: default, this process's), or the
    simulated device's budget less what its other process holds; None when unknown."""
    if device != "cuda":
        simulated = _simulated()
        return None if simulated is None or budget_bytes is None else budget_bytes - simulated
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(rank))).free)
    except Exception as exc:  # noqa: BLE001 - NVML raises its own types
        log.debug("NVML memory info unavailable: %s", exc)
        return None


def _nvml_index(rank: Optional[int] = None) -> int:
    """The NVML index of a rank's GPU (default: this process's, LOCAL_RANK, 0 outside a probe of several ranks): its
    entry of CUDA_VISIBLE_DEVICES (NVML ignores that variable)."""
    if rank is None:
        rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    visible = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    if not visible:
        return rank
    chosen = visible[rank] if rank < len(visible) else visible[0]
    return int(chosen) if chosen.isdigit() else rank


def disturbed(stats: Dict[str, Any], budget_bytes: Optional[int]) -> bool:
    """The other processes grew during the probe by more than a slack: an OOM then is not the candidate's."""
    start, end = stats.get("others_start_bytes"), stats.get("others_end_bytes")
    if not isinstance(start, int) or not isinstance(end, int):
        return False
    slack = max(DISTURBANCE_BYTES, int(0.01 * budget_bytes)) if budget_bytes else DISTURBANCE_BYTES
    return end - start > slack
