"""Device memory meters used inside a probe process.

A meter answers three things: the peak bytes of the current phase, the peak of every phase seen, and (for the
simulated meter) when to raise an out-of-memory error. Phases are named by the probe ("load", "forward_backward",
"optimizer_step", ...); switching phase closes the previous one.

- ``CudaMeter``: the real thing. Peak reserved bytes of the caching allocator (what OOMs) plus the memory of
  this process that PyTorch does not manage (CUDA context, cuBLAS, NCCL), read through NVML. A budget smaller than
  the card is enforced with ``torch.cuda.set_per_process_memory_fraction``.
- ``SimulatedMeter``: counts the bytes of live tensor storages through a ``TorchDispatchMode`` and raises
  ``torch.OutOfMemoryError`` when they exceed the budget. Real training on the CPU, measured; not GPU-exact.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from typing import Callable, Dict, List, Optional, Set, Tuple, Union

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

log = logging.getLogger(__name__)

OTHERS_REREAD_S = 0.2


class _PhaseLedger:
    """Keeps the peak of each named phase; subclasses supply the live and peak readings."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.phase_peaks: Dict[str, int] = {}

    def _read_peak(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _reset_peak(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def set_phase(self, name: str) -> None:
        if name == self.phase:
            return
        self._close_phase()
        self.phase = name
        self._reset_peak()

    def _close_phase(self) -> None:
        peak = self._read_peak()
        self.phase_peaks[self.phase] = max(self.phase_peaks.get(self.phase, 0), peak)

    def peaks(self) -> Dict[str, int]:
        self._close_phase()
        return dict(self.phase_peaks)

    def peak(self) -> int:
        return max(self.peaks().values(), default=0)


class SimulatedMeter(_PhaseLedger, TorchDispatchMode):
    """Counts live tensor storage bytes; raises ``torch.OutOfMemoryError`` above ``budget_bytes``.

    Each storage is counted once, when an op first returns it, and released by a ``weakref.finalize`` when the
    storage is freed (PyTorch keeps the storage's Python object alive exactly as long as the memory).
    Tensors that existed before the mode was entered are added with ``track``.

    ``host_aware``: an engine keeps some storages in host memory (optimizer offload), which on the CPU are not
    told apart by device. Every allocation and release is then logged, the budget is checked after the run
    (``check_budget``) rather than at each allocation, and the peaks are replayed without the storages named
    by ``set_host`` (those live at the end of the run: the engine's persistent host state) and ``mark_host``
    (a storage the moment it is allocated in host memory: activation offloading's copies, freed during the run).
    """

    def __init__(self, budget_bytes: Optional[int] = None, others: Optional[Callable[[], int]] = None,
                 host_aware: bool = False) -> None:
        _PhaseLedger.__init__(self)
        TorchDispatchMode.__init__(self)
        self.budget_bytes = budget_bytes
        self.live = 0
        self._phase_peak = 0
        self._seen: Dict[int, int] = {}
        # (storage key, byte change), or (None, phase name) where a phase begins
        self._events: Optional[List[Tuple[Optional[int], Union[int, str]]]] = [] if host_aware else None
        self._host_keys: Set[int] = set()
        self.host_bytes = 0
        self._last_alloc: Dict[int, int] = {}  # storage key -> index of its allocation event
        self._host_events: Set[int] = set()  # allocation events of storages marked as host memory when made
        self._host_now: Set[int] = set()
        self.host_peak_bytes = 0
        # Memory another process holds on the simulated device (autofit.machine._others), read again now and then.
        self._others = others
        self._others_bytes, self._others_read = 0, 0.0

    # -- accounting -------------------------------------------------------------------------------------------
    def _add(self, tensor: torch.Tensor) -> int:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
            return 0
        if is_traceable_wrapper_subclass(tensor):  # a DTensor: the memory is its shard (the wrapper's storage is
            return sum(self._add(getattr(tensor, name)) for name in tensor.__tensor_flatten__()[0])  # global-sized)
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested or functional wrappers
            return 0
        key = storage._cdata
        if key in self._seen:
            return 0
        nbytes = storage.nbytes()
        self._seen[key] = nbytes
        self.live += nbytes
        if self._events is not None:
            self._last_alloc[key] = len(self._events)
            self._events.append((key, nbytes))
        weakref.finalize(storage, self._release, key)
        return nbytes

    def _release(self, key: int) -> None:
        nbytes = self._seen.pop(key, 0)
        self.live -= nbytes
        self._host_now.discard(key)
        if self._events is not None and nbytes:
            self._events.append((key, -nbytes))

    def track(self, *modules_or_tensors) -> None:
        """Count tensors created outside the mode (for example loaded from disk)."""
        for item in modules_or_tensors:
            if isinstance(item, torch.nn.Module):
                for tensor in list(item.parameters()) + list(item.buffers()):
                    self._add(tensor)
            elif isinstance(item, torch.Tensor):
                self._add(item)
        self._bump(0, "track")

    def _others_now(self) -> int:
        if self._others is None:
            return 0
        now = time.monotonic()
        if now - self._others_read > OTHERS_REREAD_S:
            self._others_bytes, self._others_read = self._others(), now
        return self._others_bytes

    def _bump(self, requested: int, op_name: str) -> None:
        self._phase_peak = max(self._phase_peak, self.live)
        if self.budget_bytes is None or self._events is not None:
            return
        limit = self.budget_bytes - self._others_now()
        if self.live > limit:
            others = f", {(self.budget_bytes - limit) / 2**20:.2f} MiB held by another process" if limit < \
                self.budget_bytes else ""
            raise torch.OutOfMemoryError(
                f"Simulated device out of memory. Tried to allocate {requested / 2**20:.2f} MiB in {op_name}; "
                f"live tensors {self.live / 2**20:.2f} MiB > budget {self.budget_bytes / 2**20:.2f} MiB{others} "
                f"(phase {self.phase})"
            )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        added = 0
        for tensor in tree_flatten(out)[0]:
            added += self._add(tensor)
        if added:
            self._bump(added, str(func))
        return out

    def resized(self, tensor: torch.Tensor) -> None:
        """``tensor``'s storage was resized in place, which no op shows the mode (``UntypedStorage.resize_``: FSDP2
        frees its gathered weights and allocates them again this way)."""
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self._seen:
            self._bump(self._add(tensor), "resize_")
            return
        change = storage.nbytes() - self._seen[key]
        self._seen[key] += change
        self.live += change
        if self._events is not None and change:
            self._events.append((key, change))
        self._bump(max(change, 0), "resize_")

    # -- host memory (optimizer offload) ------------------------------------------------------------------------
    def set_host(self, tensors) -> None:
        """The storages of ``tensors`` are host memory: left out of the replayed device peaks."""
        keys = {t.untyped_storage()._cdata for t in tensors}
        self._host_keys = {key for key in keys if key in self._seen}
        self.host_bytes = sum(self._seen[key] for key in self._host_keys)

    def mark_host(self, tensor: torch.Tensor) -> None:
        """``tensor``'s storage, just allocated, is host memory for as long as it lives (needs ``host_aware``)."""
        key = tensor.untyped_storage()._cdata
        if self._events is None or key not in self._seen:
            return
        self._host_events.add(self._last_alloc[key])
        self._host_now.add(key)

    def is_host(self, tensor: torch.Tensor) -> bool:
        """``tensor``'s storage was marked as host memory and is still live."""
        try:
            return tensor.untyped_storage()._cdata in self._host_now
        except (RuntimeError, NotImplementedError):
            return False

    def set_phase(self, name: str) -> None:
        if self._events is not None and name != self.phase:
            self._events.append((None, name))
        super().set_phase(name)

    def peaks(self) -> Dict[str, int]:
        if self._events is None:
            return super().peaks()
        return self._replayed_peaks()

    def _replayed_peaks(self) -> Dict[str, int]:
        assert self._events is not None  # host-aware
        # The storages still live under a host key were allocated by that key's last allocation event.
        last_alloc = {key: index for index, (key, change) in enumerate(self._events)
                      if key in self._host_keys and isinstance(change, int) and change > 0}
        host_events = set(last_alloc.values()) | self._host_events
        phase, live, host_live, peaks = "setup", 0, {}, {}
        host, host_peak = 0, 0
        peaks[phase] = 0
        for index, (key, change) in enumerate(self._events):
            if isinstance(change, str):  # (None, phase name)
                phase = change
                peaks[phase] = max(peaks.get(phase, 0), live)
            elif change > 0:
                if index in host_events:
                    host_live[key] = change
                    host += change
                    host_peak = max(host_peak, host)
                else:
                    live += change
                    peaks[phase] = max(peaks[phase], live)
            elif key in host_live:
                host -= host_live.pop(key)
            else:
                live += change
        self.host_peak_bytes = host_peak
        return peaks

    def check_budget(self) -> None:
        """After a host-aware run: the out-of-memory error the device would have raised, if any."""
        if self.budget_bytes is None or self._events is None:
            return
        peaks = self._replayed_peaks()
        phase, peak = max(peaks.items(), key=lambda item: item[1])
        limit = self.budget_bytes - self._others_now()
        if peak > limit:
            self.phase = phase  # where the device would have run out, for the probe's report
            raise torch.OutOfMemoryError(
                f"Simulated device out of memory (checked after the run, {self.host_bytes / 2**20:.2f} MiB of "
                f"offloaded state counted as host memory): device peak {peak / 2**20:.2f} MiB > budget "
                f"{limit / 2**20:.2f} MiB (phase {phase})"
            )

    # -- phase ledger -----------------------------------------------------------------------------------------
    def _read_peak(self) -> int:
        return max(self._phase_peak, self.live)

    def _reset_peak(self) -> None:
        self._phase_peak = self.live

    def stats(self) -> Dict[str, int]:
        stats = {"live_bytes": self.live}
        if self._events is not None:
            stats["host_bytes"] = self.host_bytes
            if self._host_events:
                stats["host_peak_bytes"] = self.host_peak_bytes
        return stats


class CudaMeter(_PhaseLedger):
    """Peak reserved bytes plus this process's non-PyTorch device memory (NVML)."""

    def __init__(self, budget_bytes: Optional[int] = None, device: int = 0, empty_after: Tuple[str, ...] = ()
                 ) -> None:
        super().__init__()
        self.device = device
        self.empty_after = empty_after  # phases whose cached blocks are released when they end (vLLM's, estimated)
        self.budget_bytes = budget_bytes
        torch.cuda.init()
        self.total_bytes = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_device(device)
        torch.empty(1, device=f"cuda:{device}")  # create the context so it can be measured
        self.context_bytes = max(0, self._process_bytes() - torch.cuda.memory_reserved(device))
        if budget_bytes is not None and budget_bytes < self.total_bytes:
            usable = budget_bytes - self.context_bytes
            if usable <= 0:
                raise torch.OutOfMemoryError(
                    f"budget {budget_bytes} bytes is below the CUDA context ({self.context_bytes} bytes)"
                )
            torch.cuda.set_per_process_memory_fraction(usable / self.total_bytes, device)
        torch.cuda.reset_peak_memory_stats(device)

    def _process_bytes(self) -> int:
        """Device memory NVML attributes to this process; falls back to driver used memory."""
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self._nvml_index())
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory:
                    return int(proc.usedGpuMemory)
        except Exception as exc:  # noqa: BLE001 - NVML missing, or no per-process accounting in containers
            log.debug("NVML per-process memory unavailable: %s", exc)
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def _nvml_index(self) -> int:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            first = visible.split(",")[self.device].strip()
            if first.isdigit():
                return int(first)
        return self.device

    def set_phase(self, name: str) -> None:
        if self.phase in self.empty_after and name != self.phase:
            self._close_phase()
            torch.cuda.empty_cache()
        super().set_phase(name)

    def _read_peak(self) -> int:
        return torch.cuda.max_memory_reserved(self.device) + self.context_bytes

    def _reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def stats(self) -> Dict[str, int]:
        stats = torch.cuda.memory_stats(self.device)
        return {
            "context_bytes": self.context_bytes,
            "alloc_retries": int(stats.get("num_alloc_retries", 0)),
            "allocated_peak_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
            "nvml_process_bytes": self._process_bytes(),
        }
