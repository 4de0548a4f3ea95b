"""A probe of several ranks: one process per GPU, started and ended together, and one result from theirs.

The runner starts every rank with the variables torchrun would give it (``engine_files.rank_env``). A rank that
ends first with a failure leaves the others waiting in a collective, so once one has failed the rest get
``RANK_GRACE_S`` to finish and are then killed; the probe's time limit kills them all. The probe's peak is the
largest rank's (each rank has the whole budget of its own GPU), an out-of-memory error on any rank is the
candidate's, and the ranks killed for another's failure do not speak for it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Optional

from autofit.core import Outcome, ProbeResult

RANK_GRACE_S = 10.0


def rank_dir(probe_dir: Path, rank: int) -> Path:
    """Rank 0 writes into the probe's folder (its phase is what the progress line shows); the others below it."""
    return probe_dir if rank == 0 else probe_dir / f"rank{rank}"


def combine(results: List[ProbeResult], killed: List[bool]) -> ProbeResult:
    """One result for the candidate from its ranks' (``killed``: the runner ended that rank after another failed)."""
    peaks = [r.peak_bytes for r in results]
    phase_peaks: Dict[str, int] = {}
    for result in results:
        for phase, value in result.phase_peaks.items():
            phase_peaks[phase] = max(phase_peaks.get(phase, 0), value)
    per_rank = {"rank_peak_bytes": peaks}
    failed = [(rank, r) for rank, r in enumerate(results) if r.outcome is not Outcome.OK and not killed[rank]]
    if not failed:
        if any(killed):  # every rank that failed was killed: the time limit
            first = next(r for r in results if r.outcome is not Outcome.OK)
            return dataclasses.replace(first, peak_bytes=max(peaks), phase_peaks=phase_peaks,
                                       stats={**first.stats, **per_rank})
        base = results[0]
        return dataclasses.replace(base, peak_bytes=max(peaks), phase_peaks=phase_peaks,
                                   stats={**base.stats, **per_rank})
    rank, worst = next(((rank, r) for rank, r in failed if r.outcome is Outcome.OOM), failed[0])
    return dataclasses.replace(worst, peak_bytes=max(peaks), phase_peaks=phase_peaks,
                               error=f"rank {rank}: {worst.error}", stats={**worst.stats, **per_rank})


def first_failure(results: List[Optional[ProbeResult]], exitcodes: List[Optional[int]]) -> bool:
    """Whether some rank has already ended badly: a result that is not OK, or an exit without one."""
    for result, code in zip(results, exitcodes, strict=True):
        if result is not None and result.outcome is not Outcome.OK:
            return True
        if result is None and code is not None:
            return True
    return False
