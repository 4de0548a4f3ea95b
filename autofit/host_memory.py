"""Host memory for an offloading engine: checked against the machine's available RAM before anything is probed.

DeepSpeed pins its offloaded states; a machine without that much free RAM swaps or kills the run (and the probe
would measure nothing useful), so the rung is left out with a note instead.
"""

from __future__ import annotations

import logging
from typing import List, Optional, Sequence, Tuple

from autofit.ladder import OFFLOAD_RUNG, LadderState, Rung, climb, usable_rungs
from autofit.spec import format_size

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


def host_shortfall(start: LadderState, rungs: Sequence[Rung], shape, device: str,
                   available: Optional[int] = None) -> Optional[str]:
    """A note when the ladder's offloading levels need more host memory than is available; None when they fit (or
    nothing offloads, or the model's sizes or the machine's RAM are unknown)."""
    from autofit.memory_model import host_bytes

    offloading = [state.candidate for state in climb(start, rungs) if state.candidate.offload]
    if not offloading or shape is None:
        return None
    # the most the level can need: with gradient accumulation, where the effective batch can be split
    need = max(host_bytes(c.replace(grad_accum=2) if c.effective_batch > 1 else c, shape, device) for c in offloading)
    available = available if available is not None else available_host_bytes()
    if available is None or need <= available:
        return None
    return (f"rung {OFFLOAD_RUNG} left out: its offloaded states need {format_size(need)} of host memory, "
            f"{format_size(available)} is available")


def probeable_rungs(start: LadderState, rungs: Sequence[Rung], model: str, device: str
                    ) -> Tuple[List[Rung], List[str]]:
    """The rungs a search on this machine climbs, and a note for each one left out (a missing engine, too little
    host memory for the offloaded states)."""
    from autofit.memory_model import shape_or_none

    usable, notes = usable_rungs(rungs, device)
    short = host_shortfall(start, usable, shape_or_none(model), device)
    if short:
        log.info("%s", short)
        notes.append(short)
        usable = [rung for rung in usable if rung.name != OFFLOAD_RUNG]
    return usable, notes
