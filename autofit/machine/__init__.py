"""The machine autofit runs on, and its files: the accelerator (asked through NVML, never CUDA) and the other
processes on it, files written whole and the cache, one search per ``--out`` and its probes' processes, and where a
model's configuration is found (bundled, a local folder, the hub's cache, the hub). Torch-free.

It builds on ``autofit.core`` (the words) and on nothing else of autofit; every package above it reads the machine
through it.
"""

from autofit.machine._device import (
    RATE_NAMES,
    GpuInfo,
    NoCudaDeviceError,
    card_of_device,
    driver_version,
    first_gpu,
    priced_card,
    resolve_device,
    resolve_gpus,
    visible_gpu_count,
)
from autofit.machine._files import (
    atomic_write_text,
    cache_dir,
    cache_entry,
    cache_subfolder,
    entry_problem,
    read_own_file,
)
from autofit.machine._others import DISTURBED_RETRY_WAIT_S, disturbed, free_bytes, other_processes, others_bytes
from autofit.machine._outdir import PHASE_FILE, PID_FILE, check_folder_private, exclusive, record_probe_process
from autofit.machine._registry import UnknownModelError, needs_own_code, resolve_model

__all__ = [
    "RATE_NAMES", "GpuInfo", "NoCudaDeviceError", "card_of_device", "driver_version", "first_gpu", "priced_card",
    "resolve_device", "resolve_gpus", "visible_gpu_count",
    "atomic_write_text", "cache_dir", "cache_entry", "cache_subfolder", "entry_problem", "read_own_file",
    "DISTURBED_RETRY_WAIT_S", "disturbed", "free_bytes", "other_processes", "others_bytes",
    "PHASE_FILE", "PID_FILE", "check_folder_private", "exclusive", "record_probe_process",
    "UnknownModelError", "needs_own_code", "resolve_model",
]
