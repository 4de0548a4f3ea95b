"""What accelerator is present, asked through NVML so the search's own process never initializes CUDA."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional, Union

from autofit.core import CARDS, Card, card_named

log = logging.getLogger(__name__)

# The CPU meter's rates, as ``autofit.probe._rates`` measures them and ``memory_model.measured_rates_card`` takes them
RATE_NAMES = ("flops", "bandwidth", "op_seconds", "half_rows", "elementwise_seconds")
# A name NVML reports for parts of different memory is told apart by the total: the nearest, within this share of it
NAME_MEMORY_TOLERANCE = 0.10  # [M: ECC on takes 6% of an RTX 6000 Ada's]


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
    except Exception as exc:  # noqa: BLE001 - NVML raises its own types: no driver, no library, no device
        log.debug("no GPU through NVML: %s", exc)
        return None


def card_of_device(device_name: Optional[str], total_bytes: Optional[int] = None) -> Optional[Card]:
    """The card of the name NVML reports for a GPU (``NVIDIA H100 80GB HBM3``, ``NVIDIA GeForce RTX 4090``); where
    the name covers parts of different memory, the one nearest ``total_bytes``. None for a card autofit does not
    know, or a total more than ``NAME_MEMORY_TOLERANCE`` from every part of that name."""
    if not device_name:
        return None
    wanted = " ".join(device_name.split()).lower()
    named = [card for card in CARDS.values() if wanted in (n.lower() for n in card.device_names)]
    if not named or not total_bytes:
        return named[0] if named else None
    nearest = min(named, key=lambda card: abs(card.memory_mib * 2**20 - total_bytes))
    if abs(nearest.memory_mib * 2**20 - total_bytes) > NAME_MEMORY_TOLERANCE * nearest.memory_mib * 2**20:
        return None
    return nearest


def priced_card(given: object, device: str) -> Optional[Card]:
    """The card a step is priced on: the one ``--gpu-memory`` names, else on a GPU the one NVML reports (a size
    names none); None on the CPU, or for a GPU autofit does not know."""
    if device != "cuda":
        return None
    named = card_named(given) if isinstance(given, str) else None
    if named is not None:
        return named
    gpu = first_gpu()
    return card_of_device(gpu.name, gpu.total_bytes) if gpu is not None else None


def driver_version() -> Optional[str]:
    """The NVIDIA driver's version as NVML says it (a driver update can change what a probe's context takes)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception as exc:  # noqa: BLE001 - NVML raises its own types: no driver, no library
        log.debug("no driver version through NVML: %s", exc)
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


def visible_gpu_count() -> int:
    """GPUs CUDA will see (CUDA_VISIBLE_DEVICES applied to NVML's count), without initializing CUDA."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception as exc:  # noqa: BLE001 - NVML raises its own types: no driver, no library
        log.debug("no GPU through NVML: %s", exc)
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count
    entries = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry or entry.startswith("-"):
            break  # CUDA stops at the first invalid entry
        entries.append(entry)
    return min(len(entries), count)


def resolve_gpus(requested: Union[int, str], device: str) -> int:
    """``--gpus``: a positive number of ranks, or "all" (every visible GPU). On the simulated device every rank has
    a simulated GPU of its own, so a number is required there."""
    if isinstance(requested, str) and requested.strip().lower() == "all":
        if device == "cpu":
            raise ValueError("--gpus all: the simulated device has no GPUs to count; give a number of ranks")
        return max(1, visible_gpu_count())
    try:
        ranks = int(requested)
    except (TypeError, ValueError):
        ranks = 0
    if isinstance(requested, bool) or ranks < 1 or str(requested).strip() not in (str(ranks), str(float(ranks))):
        raise ValueError(f"--gpus {requested!r} is not valid: a positive number of GPUs or 'all' is accepted")
    if device == "cuda" and ranks > visible_gpu_count():
        raise ValueError(f"--gpus {ranks}: only {visible_gpu_count()} GPU(s) are visible here (the search runs on one "
                         "machine; several machines are for the export, see --help)")
    return ranks
