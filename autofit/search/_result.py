"""What a search found: every probe (``Record``), every candidate the memory model ruled out (``Skip``), the fits,
and the choice (``SearchReport``). Plain data; the export and the CLI read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from autofit import memory_model
from autofit.core import ALGORITHMS, Candidate, Outcome, ProbeResult, SearchSpec, clip, format_size
from autofit.rungs import LadderState

# Config field that holds the searched sequence length, per algorithm (RL: the completion length).
LENGTH_FIELD = {a.name: a.length_field for a in ALGORITHMS.values()}


class ProbeLimitReached(Exception):
    """--max-probes probes have run: choose among the fits found so far."""


@dataclass
class Record:
    level: int
    candidate: Candidate
    kind: str  # "probe" or "verify"
    result: ProbeResult
    cached: bool
    predicted_bytes: Optional[float] = None  # the memory model's peak before this probe (calibrated when it could)
    prior_bytes: Optional[float] = None  # the uncalibrated prediction
    stage: str = "walk"  # "walk", "refine" (the sampler's) or "verify"
    calibration: str = "prior"  # how predicted_bytes was calibrated: "prior" (not), "scale" or "two-term"

    def log_line(self, index: int) -> str:
        """The line the search logs for this probe."""
        result = self.result
        detail = f"peak {format_size(result.peak_bytes)}"
        if self.predicted_bytes is not None:
            detail += f" (predicted {format_size(self.predicted_bytes)})"
        if result.fits:
            detail += f", {result.tokens_per_second:,.0f} tok/s"
        else:
            where = result.error_phase or "?"
            if result.origin and result.outcome is not Outcome.OOM:
                where += f" ({result.origin})"
            detail += f" in {where}: {clip(result.error, 160)}"
        return (f"{self.kind} {index:<5} [{'+'.join(self.candidate.rungs) or 'baseline'}] {self.candidate.describe()}: "
                f"{result.outcome.value} {detail}{' (stored)' if self.cached else ''}")

    @property
    def calibrated(self) -> bool:
        return self.calibration != "prior"


@dataclass
class Skip:
    """A candidate not probed: the memory model's low end is over the budget."""

    level: int
    candidate: Candidate
    predicted_bytes: float
    uncertainty: float


@dataclass
class SpeedSkip:
    """A candidate not timed: the throughput model predicts it slower than a measured fit by more than its band."""

    level: int
    candidate: Candidate
    predicted_tps: float
    than: Candidate  # the measured fit it would lose to
    than_predicted_tps: float
    band: float


@dataclass
class Fit:
    level: int
    candidate: Candidate
    result: ProbeResult


@dataclass
class SearchReport:
    spec: SearchSpec
    levels: List[LadderState]
    records: List[Record] = field(default_factory=list)
    skipped: List[Skip] = field(default_factory=list)
    chosen: Optional[Fit] = None
    verified: Optional[ProbeResult] = None
    notes: List[str] = field(default_factory=list)
    probes_run: int = 0
    probes_total: int = 0
    calibration: Optional[memory_model.Calibration] = None
    probe_limit_reached: bool = False
    margin: float = 0.0  # the fraction of the budget kept free when the choice was made
    stopped: Optional[str] = None  # why the search stopped without an answer about memory (autofit.search._faults)
    ladder_len: Optional[int] = None  # levels of the ladder itself; those after are rebuilt without a rung
    side_by_side: Optional[Dict[str, Any]] = None  # probes on several devices: devices, rounds, started, unused
    speed_skipped: List[SpeedSkip] = field(default_factory=list)  # not timed (autofit.search._speed_skip)
    speed_model: Optional[memory_model.SpeedCalibration] = None  # the throughput model calibrated on the timings
    answer: Any = None  # the answer as the export derived it once (``autofit.export.Answer``), set when written
    fingerprint: str = ""  # what this search's probes were measured on (``autofit.search._store.fingerprint``)

    @property
    def fits(self) -> bool:
        return self.chosen is not None

    def lightest_failure(self) -> Optional[Record]:
        """The OOM with the smallest peak at the most optimized level: how far from fitting we are."""
        ooms = [r for r in self.records if r.result.outcome is Outcome.OOM]
        if not ooms:
            return None
        last = max(r.level for r in ooms)
        return min((r for r in ooms if r.level == last), key=lambda r: r.result.peak_bytes)


def undominated(fits: List[Fit]) -> List[Fit]:
    """Drop a fit whose extra rungs bought nothing: a fit with the same micro-batch and length and a subset of its
    rungs (an earlier level, or a level rebuilt without a rung) cannot be faster with more recomputation or be a
    smaller change to the training, whatever one noisy timed step says."""
    kept = []
    for fit in fits:
        size, rungs = (fit.candidate.micro_batch, fit.candidate.max_length), set(fit.candidate.rungs)
        if not any(set(other.candidate.rungs) < rungs and (other.candidate.micro_batch, other.candidate.max_length)
                   == size for other in fits):
            kept.append(fit)
    return kept


def truncation_note(spec: SearchSpec, candidate: Candidate) -> Optional[str]:
    """What the chosen length gives up, in one sentence; None when nothing is cut."""
    field = LENGTH_FIELD.get(spec.options.algo, "max_length")
    if spec.options.maximize == "length":
        return f"longest {field} that fits: {candidate.max_length} (searched {spec.min_length}..{spec.max_length})"
    if candidate.max_length < spec.max_length:
        what = "completions are cut at" if candidate.is_rl else "training examples longer than that are truncated to"
        return f"{field} cut from {spec.max_length} to {candidate.max_length}: {what} {candidate.max_length} tokens"
    return None
