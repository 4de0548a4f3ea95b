"""What accelerator is present, asked through NVML so the search's own process never initializes CUDA."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    total_bytes: int


def _first_visible_index() -> Optional[int]:
    """The NVML index of the device CUDA will use first: CUDA_VISIBLE_DEVICES' first entry (NVML ignores that
    variable); None when it hides every device."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return 0
    first = visible.split(",")[0].strip()
    if not first or first.startswith("-"):
        return None
    return int(first) if first.isdigit() else 0


def first_gpu() -> Optional[GpuInfo]:
    index = _first_visible_index()
    if index is None:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() <= index:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        return GpuInfo(name, int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
    except Exception as exc:  # no driver, no library, no device
        log.debug("no GPU through NVML: %s", exc)
        return None


class NoCudaDeviceError(ValueError):
    pass


def resolve_device(requested: str) -> str:
    """'auto' -> 'cuda' when NVML sees a GPU, else 'cpu'. 'cuda' without a visible GPU is refused at once: every
    probe would fail, and that says nothing about memory."""
    if requested == "auto":
        return "cuda" if first_gpu() is not None else "cpu"
    if requested == "cuda" and first_gpu() is None:
        raise NoCudaDeviceError(
            "--device cuda: no CUDA device is visible (NVML finds no GPU, or CUDA_VISIBLE_DEVICES hides them all); "
            "use --device cpu for the simulated device"
        )
    return requested
