"""What accelerator is present, asked through NVML so the search's own process never initializes CUDA."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    total_bytes: int


def first_gpu() -> Optional[GpuInfo]:
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else name
        return GpuInfo(name, int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
    except Exception as exc:  # no driver, no library, no device
        log.debug("no GPU through NVML: %s", exc)
        return None


def resolve_device(requested: str) -> str:
    """'auto' -> 'cuda' when NVML sees a GPU, else 'cpu'."""
    if requested == "auto":
        return "cuda" if first_gpu() is not None else "cpu"
    return requested
