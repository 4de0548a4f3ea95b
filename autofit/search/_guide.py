"""The memory model as the search uses it: predictions calibrated on the probes so far, the margin of the budget
kept free, and whether a measured peak fits within it. The search decides; this answers."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

from autofit import memory_model
from autofit.core import RL_ALGOS, Candidate, InputError, ProbeResult, SearchSpec, as_trained, format_size
from autofit.memory_model import NoCausalLM, ensure_census
from autofit.search._result import SearchReport

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
        self.built: Dict[str, Any] = {}  # what the first probe's trainer runs (autofit.probe._observe)
        unchecked = memory_model.unchecked_reason(shape, spec.options.algo) if shape is not None else None
        if unchecked and shape is not None:
            band = memory_model.prior_uncertainty(shape, spec.options.algo)
            report.notes.append(f"memory model: {unchecked}: its predictions carried a ±{band:.0%} band until probes "
                                "calibrated it")

    def observe(self, candidate: Candidate, result: ProbeResult) -> List[str]:
        """Learn what the trainer runs from the first probe that says; returns notes on what differs from the
        candidates (the user's own LoRA, data shorter than max_length)."""
        if self.built or not result.observed or self.spec.factory is None:
            return []  # the built-in factories build exactly the candidate
        self.built = result.observed
        notes = []
        peft = self.built.get("peft")
        if peft and candidate.lora is None:
            notes.append(f"your trainer applies its own LoRA (r={peft.get('r')}, alpha {peft.get('lora_alpha')}, "
                         f"targets {peft.get('target_modules')}): it is exported and predicted as such")
        longest = self.built.get("longest_row")
        if longest and self.spec.options.algo not in RL_ALGOS and longest < candidate.max_length:
            notes.append(f"the longest row of your trainer's dataset has {longest} tokens, fewer than max_length "
                         f"{candidate.max_length}: peaks were measured at {longest} tokens, and longer data needs more "
                         "memory (pad a probe row to max_length to measure the worst case)")
        for note in notes:
            log.warning("%s", note)
        return notes

    def as_built(self, candidate: Candidate) -> Candidate:
        """The candidate as the user's trainer runs it: what it adds of its own (its LoRA, quantized base,
        generations: ``autofit.core.as_trained``), its prompts' lengths, and rows no longer than its data's longest
        (the trainer truncates to max_length; shorter data stays shorter)."""
        if not self.built:
            return candidate
        candidate = as_trained(candidate, self.built)
        changes: Dict[str, Any] = {}
        longest = self.built.get("longest_row")
        if candidate.is_rl:
            if longest:
                changes["prompt_length"] = longest
        elif longest and longest < candidate.max_length:
            changes["max_length"] = longest
        return candidate.replace(**changes) if changes else candidate

    def ledger(self, candidate: Candidate, calibrated: bool = True) -> Optional[memory_model.Ledger]:
        if self.shape is None:
            return None
        try:
            calibration = self.calibration if calibrated else None
            return memory_model.predict_calibrated(self.as_built(candidate), calibration, self.shape)
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
        points = [(self.as_built(r.candidate), r.result.peak_bytes) for r in self.report.records
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
                  if r.kind == "probe" and r.calibration == "two-term" and r.result.fits and r.result.peak_bytes
                  and r.predicted_bytes is not None]
        return max(self.spec.headroom, min(max(errors, default=0.0), MAX_MARGIN))

    def limit(self) -> float:
        budget = self.spec.budget_bytes
        return math.inf if budget is None else budget * (1 - self.margin())

    def predicted_start(self, values: Sequence[int], make: Callable[[int], Candidate]) -> int:
        """Index of the largest value predicted to fit; without a prediction, the smallest value."""
        if self.spec.budget_bytes is None:
            return len(values) - 1
        start = 0
        for index, value in enumerate(values):
            predicted = self.predict(make(value))
            if predicted is None:
                return 0
            if predicted <= self.limit():
                start = index
        return start

    def fits(self, result: ProbeResult) -> bool:
        """Measured within the budget minus the margin kept for what a short probe cannot see."""
        return result.fits and result.peak_bytes <= self.limit()

    def implausible(self, candidate: Candidate, result: ProbeResult) -> bool:
        """A stored result of a built-in trainer far outside what the memory model allows (a study edited to say
        "peak 1 B"): not to be reused. A user's trainer is not held to the ledger."""
        ledger = self.ledger(candidate, calibrated=False)
        if self.spec.factory is not None or ledger is None or result.outcome.value not in ("OK", "OOM"):
            return False
        if ledger.low / 2 <= result.peak_bytes <= ledger.high * 2 and result.peak_bytes > 0:
            return False
        log.warning("the stored probe of %s says %s, far from the %s the memory model predicts: measured again",
                    candidate.describe(), format_size(result.peak_bytes), format_size(ledger.total))
        return True


def model_shape(spec: SearchSpec) -> Optional[memory_model.ModelShape]:
    """The model's shape with its parameters counted from the model (built once, cached), and a line in the log
    when the prediction for it is not a checked one (``MemoryGuide`` notes it in the report)."""
    try:
        ensure_census(spec.options.model, trust_remote_code=spec.options.trust_remote_code)
    except NoCausalLM as exc:
        if spec.factory is None:  # the built-in trainers load the model by name: they would fail on every probe
            raise InputError(str(exc)) from None
        log.info("%s; your factory loads it its own way", exc)
    shape = memory_model.shape_or_none(spec.options.model)
    if shape is not None:
        reason = memory_model.unchecked_reason(shape, spec.options.algo)
        if reason:
            log.info("memory model: %s; predictions carry a ±%.0f%% band until probes calibrate them", reason,
                     100 * memory_model.prior_uncertainty(shape, spec.options.algo))
    return shape
