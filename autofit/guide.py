"""The memory model as the search uses it: predictions calibrated on the probes so far, the margin of the budget
kept free, and whether a measured peak fits within it. The search decides; this answers."""

from __future__ import annotations

import logging
import math
from typing import Optional

from autofit import memory_model
from autofit.candidate import Candidate
from autofit.outcome import ProbeResult
from autofit.report import SearchReport
from autofit.spec import SearchSpec

log = logging.getLogger(__name__)

# The margin follows the model's measured error up to this fraction of the budget; a model that misses by more
# is not describing this run, and the verification is what catches the rest.
MAX_MARGIN = 0.10


class MemoryGuide:
    def __init__(self, spec: SearchSpec, report: SearchReport, shape: Optional[memory_model.ModelShape]):
        self.spec = spec
        self.report = report  # its records are the probes the model learns from
        self.shape = shape  # None: no memory model (plain bisection)
        self.calibration: Optional[memory_model.Calibration] = None

    def ledger(self, candidate: Candidate, calibrated: bool = True) -> Optional[memory_model.Ledger]:
        if self.shape is None:
            return None
        try:
            calibration = self.calibration if calibrated else None
            return memory_model.predict_calibrated(candidate, calibration, self.shape)
        except (KeyError, ValueError, ZeroDivisionError) as exc:  # a configuration the ledger cannot describe
            log.debug("no prediction for %s: %s", candidate.describe(), exc)
            return None

    def predict(self, candidate: Candidate, calibrated: bool = True) -> Optional[float]:
        ledger = self.ledger(candidate, calibrated)
        return ledger.total if ledger is not None else None

    def learn(self, result: ProbeResult) -> None:
        """Calibrate the memory model on every probe that ran to the end."""
        if self.shape is None or not result.fits or not result.peak_bytes:
            return
        points = [(r.candidate, r.result.peak_bytes) for r in self.report.records
                  if r.kind == "probe" and r.result.fits and r.result.peak_bytes]
        try:
            self.calibration = memory_model.calibrate(points, self.shape, device=self.spec.device)
        except (KeyError, ValueError, ZeroDivisionError) as exc:
            log.debug("calibration failed: %s", exc)

    def margin(self) -> float:
        """The fraction of the budget kept free: the headroom, or the memory model's measured error when that is
        larger. The error is how far probes that ran to the end went over the prediction made for them by the
        model calibrated on earlier probes at two or more token counts: memory the ledger does not explain is memory
        a longer run may show too. A prediction above the measured peak hides nothing, so it adds no margin; a
        one-scale extrapolation (a single point) is rough by construction, and its band already says so."""
        errors = [(r.result.peak_bytes - r.predicted_bytes) / r.result.peak_bytes for r in self.report.records
                  if r.kind == "probe" and r.calibration == "two-term" and r.result.fits and r.result.peak_bytes]
        return max(self.spec.headroom, min(max(errors, default=0.0), MAX_MARGIN))

    def limit(self) -> float:
        budget = self.spec.budget_bytes
        return math.inf if budget is None else budget * (1 - self.margin())

    def fits(self, result: ProbeResult) -> bool:
        """Measured within the budget minus the margin kept for what a short probe cannot see."""
        return result.fits and result.peak_bytes <= self.limit()
