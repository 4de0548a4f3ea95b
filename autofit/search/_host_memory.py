"""Host memory for an offloading engine: checked against the machine's available RAM before anything is probed.

DeepSpeed pins its offloaded states; a machine without that much free RAM swaps or kills the run (and the probe
would measure nothing useful), so the rung is left out with a note instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from autofit.core import Candidate, format_size
from autofit.rungs import LadderState, Rung, climb, usable_rungs

if TYPE_CHECKING:
    from autofit.memory_model import ModelShape

log = logging.getLogger(__name__)


def available_host_bytes(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """MemAvailable (the kernel's estimate of what can be allocated without swapping), or None where unknown."""
    try:
        with open(meminfo) as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _least_need(candidate: Candidate, shape: ModelShape, device: str) -> float:
    """The least host memory a level can get by with: optimizer offload with gradient accumulation where the
    effective batch can be split (its fp32 buffer counted), offloaded activations at micro-batch 1."""
    from autofit.memory_model import host_bytes

    if candidate.effective_batch > 1:
        candidate = candidate.replace(micro_batch=1, grad_accum=candidate.effective_batch)
    return host_bytes(candidate, shape, device)


def host_shortfalls(start: LadderState, rungs: Sequence[Rung], shape: Optional[ModelShape], device: str,
                    available: Optional[int] = None) -> List[Tuple[str, str]]:
    """(rung, note) for each offloading rung (one with ``host_memory`` words) whose levels need more host memory than
    is available, even at their smallest micro-batch, in the ladder's order; empty when they fit (or nothing offloads,
    or the sizes or the machine's RAM are unknown)."""
    if shape is None:
        return []
    available = available if available is not None else available_host_bytes()
    rungs = list(rungs)
    found: List[Tuple[str, str]] = []
    for name, what in [(rung.name, what) for rung in rungs if (what := getattr(rung, "host_memory", ""))]:
        needs = [_least_need(state.candidate, shape, device) for state in climb(start, rungs) if name in state.rungs]
        if not needs or available is None or min(needs) <= available:
            continue
        rungs = [rung for rung in rungs if rung.name != name]
        found.append((name, f"rung {name} left out: its {what} need {format_size(min(needs))} of host memory, "
                            f"{format_size(available)} is available"))
    return found


def probeable_rungs(start: LadderState, rungs: Sequence[Rung], model: str, device: str
                    ) -> Tuple[List[Rung], List[str]]:
    """The rungs a search on this machine climbs, and a note for each one left out (a missing engine, too little
    host memory for what is offloaded), and one for each the memory model does not describe (another package's)."""
    from autofit.memory_model import rung_notes, shape_or_none

    usable, notes = usable_rungs(rungs, device, start)
    for name, note in host_shortfalls(start, usable, shape_or_none(model), device):
        log.info("%s", note)
        notes.append(note)
        usable = [rung for rung in usable if rung.name != name]
    return usable, notes + rung_notes(usable)
