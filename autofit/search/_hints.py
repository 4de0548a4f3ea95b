"""What the user can change when nothing fits (issue 61, item 2): the knob that blocks, with the value that would fit
where the memory model can say it. The length first (``--max-length`` for sft, reward, dpo and kto, the completion's
for the RL algorithms): the longest the model predicts to fit with every rung of the ladder on; then a larger
``--gpu-memory``, at least what the lightest configuration is predicted to need; then the batch and the ladder.

The prediction is the memory model's, calibrated on the search's probes where they calibrated it; a trainer of the
user's own is not held to the built-in ledger, so its hints name the knobs without values."""

from __future__ import annotations

import logging
from typing import List, Optional, Tuple

from autofit import memory_model
from autofit.core import Candidate, algorithm, format_size
from autofit.memory_model import divisors, length_grid
from autofit.search._result import SearchReport

log = logging.getLogger(__name__)


def length_flag(algo: str) -> str:
    """The option that sets the searched length of ``algo``."""
    return "--max-completion-length" if algorithm(algo).rl else "--max-length"


def _lightest(report: SearchReport, length: int) -> Optional[float]:
    """The smallest peak the memory model predicts for the ladder's last level at ``length`` (over its micro-batches:
    at short lengths micro-batch 1 with accumulation can need more than the whole batch); None where it cannot say."""
    spec = report.spec
    if spec.factory is not None or not report.levels:
        return None
    shape = memory_model.shape_or_none(spec.options.model)
    if shape is None:
        return None
    state = report.levels[(report.ladder_len or len(report.levels)) - 1]
    per_rank = state.per_rank(spec.rank_batch)
    batches = divisors(per_rank) if state.vary_batch else [state.candidate.micro_batch]
    peaks: List[float] = []
    for batch in batches:
        candidate: Candidate = state.candidate.replace(micro_batch=batch, grad_accum=per_rank // batch,
                                                       max_length=length)
        try:
            peaks.append(memory_model.predict_calibrated(candidate, report.calibration, shape).total)
        except (KeyError, ValueError, ZeroDivisionError) as exc:  # a configuration the ledger cannot describe
            log.debug("no prediction for %s: %s", candidate.describe(), exc)
    return min(peaks, default=None)


def fitting_length(report: SearchReport) -> Optional[Tuple[int, float]]:
    """(the longest length below the searched one at which the lightest level is predicted to fit, its peak)."""
    spec = report.spec
    if spec.budget_bytes is None:
        return None
    limit = spec.budget_bytes * (1 - spec.headroom)
    for length in reversed(length_grid(min(8, spec.max_length), spec.max_length)[:-1]):
        peak = _lightest(report, length)
        if peak is None:
            return None
        if peak <= limit:
            return length, peak
    return None


def no_fit_hints(report: SearchReport) -> str:
    """The sentence that ends "nothing fits": what to change, in order, with the values the memory model gives (none
    where it predicts the searched length to fit: the probes said otherwise, so it does not describe this run)."""
    spec = report.spec
    flag = length_flag(spec.options.algo)
    floor = "--min-completion-length" if algorithm(spec.options.algo).rl else "--min-length"
    lightest = _lightest(report, spec.max_length)
    trusted = lightest is not None and spec.budget_bytes is not None and lightest > spec.budget_bytes
    found = fitting_length(report) if trusted else None
    if found is not None:
        length, peak = found
        hints = [f"{flag} {length} (the longest the memory model predicts to fit: {format_size(peak)} with every "
                 f"rung; {floor} {length} lets the search shorten only where it must)"]
    else:
        hints = [f"a lower {flag} (or a {floor} below it, to let the search shorten it)"]
    hints.append(f"a --gpu-memory of at least {format_size(lightest)} (the lightest configuration at {flag} "
                 f"{spec.max_length})" if trusted and lightest is not None else "a larger --gpu-memory")
    hints += ["a smaller --effective-batch", "more rungs in --ladder"]
    return "Try " + ", ".join(hints[:-1]) + ", or " + hints[-1] + "."
