"""Not timing what is predicted slower (issue 37, item 3): once a level of the free or speed class has a measured
fit, the walk visits the other levels of that class only to compare speed (the class is already decided, and within
it the fastest fit wins). A candidate there that the throughput model, calibrated on the search's own timed probes,
predicts slower than the fastest measured fit by more than its band is not probed at all: it could only lose. It is
recorded as skipped by speed (not a failure), the notes say how many and why, and best.json lists them.

Not used: in the level that first fits (what fits is still unknown there), in the quality class (its first level
that fits wins whatever its speed), under ``--maximize length`` (the longest fit wins, however slow), under
``--no-predict`` (no model), with a custom trainer (the model describes the built-in ones), and where the model has
no rates (no card named on CUDA, or this machine's could not be measured). The band is the calibrated model's: 20%
with one scale, the fitted residual (at least 10%) once the timings span two micro-batch sizes
(``autofit.memory_model._speed_calibration``)."""

from __future__ import annotations

import logging
from typing import List, Optional

from autofit import memory_model
from autofit.core import Candidate, SearchSpec
from autofit.rungs import FREE, SPEED
from autofit.search._result import Fit, SearchReport, SpeedSkip
from autofit.search._speed_tie import SpeedJudge
from autofit.search._store import ProbeStore

log = logging.getLogger(__name__)


class SpeedGate:
    """Whether a candidate is worth timing, against the fits measured so far in the class being compared."""

    def __init__(self, spec: SearchSpec, judge: SpeedJudge, report: SearchReport, store: ProbeStore):
        self.spec, self.judge, self.report, self.store = spec, judge, report, store
        self.fits: List[Fit] = []  # the measured fits of the class whose other levels are visited for speed

    def compare(self, fits: List[Fit], cost: Optional[str]) -> None:
        """The walk's fits so far and its cost class; the gate is open (nothing skipped) outside the free and speed
        classes, and before any fit."""
        compared = cost in (FREE, SPEED) and self.spec.factory is None
        # --maximize length: a longer fit wins however slow, so nothing is ruled out by its speed
        self.fits = list(fits) if compared and self.spec.options.maximize != "length" else []

    def calibration(self) -> Optional[memory_model.SpeedCalibration]:
        """The throughput model calibrated on every timed probe so far; None without a model, rates or a timed probe
        (this machine's rates are measured only for one: ``autofit.search._machine_rates``)."""
        points = [(r.candidate, r.result.tokens_per_second) for r in self.report.records
                  if r.kind == "probe" and r.result.fits and r.result.tokens_per_second > 0]
        shape = self.judge.guide.shape
        card = self.judge.card() if shape is not None and points else None
        if shape is None or card is None:
            return None
        try:
            return memory_model.calibrate_speed(points, shape, card)
        except (KeyError, ValueError, ZeroDivisionError) as exc:  # a configuration the model cannot describe
            log.debug("no speed calibration: %s", exc)
            return None

    def skips(self, level: int, candidate: Candidate) -> bool:
        """True (and recorded) when ``candidate`` is predicted slower than the fastest measured fit by more than the
        calibrated model's band."""
        if not self.fits or self.store.lookup(candidate, "probe", self.spec.options.probe_steps) is not None:
            return False  # nothing to compare with, or measured already (here or in a stored run): it costs nothing
        calibration = self.calibration()
        if calibration is None:
            return False
        shape, card = self.judge.guide.shape, self.judge.card()
        assert shape is not None and card is not None  # a calibration has both
        try:
            mine = calibration.predict(candidate, shape, card).tokens_per_second
            best = max(self.fits, key=lambda f: calibration.predict(f.candidate, shape, card).tokens_per_second)
            theirs = calibration.predict(best.candidate, shape, card).tokens_per_second
        except (KeyError, ValueError, ZeroDivisionError) as exc:
            log.debug("no speed prediction for %s: %s", candidate.describe(), exc)
            return False
        band = calibration.uncertainty
        if mine >= theirs * (1 - band):
            return False
        if not any(s.candidate.key() == candidate.key() for s in self.report.speed_skipped):
            self.report.speed_skipped.append(SpeedSkip(level, candidate, mine, best.candidate, theirs, band))
            log.info("skip  [%s] %s: predicted %s tok/s, %.0f%% under %s (%s tok/s predicted, %s measured), beyond "
                     "the speed model's ±%.0f%%", "+".join(candidate.rungs) or "baseline", candidate.describe(),
                     f"{mine:,.0f}", 100 * (1 - mine / theirs), best.candidate.describe(), f"{theirs:,.0f}",
                     f"{best.result.tokens_per_second:,.0f}", 100 * band)
        return True

    def finish(self) -> None:
        """The calibrated model into the report, and one note on what was not timed."""
        self.report.speed_model = self.calibration()
        skipped = self.report.speed_skipped
        if not skipped:
            return
        card = self.judge.card()
        self.report.notes.append(
            f"not timed, predicted slower than a measured fit by more than the throughput model's band (on "
            f"{card.name if card else 'its rates'}, calibrated on this search's timed probes): {len(skipped)} "
            "candidate(s): " + "; ".join(
                f"{s.candidate.describe()} ({s.predicted_tps:,.0f} tok/s predicted against {s.than.describe()}'s "
                f"{s.than_predicted_tps:,.0f}, ±{s.band:.0%})" for s in skipped)
            + "; --no-predict times them")
