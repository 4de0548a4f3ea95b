"""Where two fits' measured speeds differ by less than the machine's noise (issue 37, item 3): a probe times one or
two steps, and on a busy machine the slower of two fits can time a few percent faster (in ``make bench``'s tight
budget for tiny-qwen2, mb=4x2 with checkpointing timed 3% faster than mb=2x4 without it; over ten steps the plain one
was 19% faster). Where the throughput model, calibrated on the search's timed probes, predicts the two further apart
than its band, the model decides. Where it cannot split them (inside its band, or no model: ``--no-predict``, no
rates), the search measures longer instead of guessing: both are verified (the run the chosen fit gets anyway, up to
10 steps / 60 s) and the faster verified one is chosen (``SpeedJudge.settle``); where the verified timings tie too
and one turns the other's rungs but for a quality rung (the drop pass's fit), the one that trades less. The
prediction runs on a named card's published rates on CUDA, and on the CPU meter on this machine's own
(``_machine_rates``: measured in a child process, the search never imports torch)."""

from __future__ import annotations

import logging
from typing import Callable, List, Optional, Sequence, Tuple

from autofit.core import ProbeResult, SearchSpec
from autofit.machine import priced_card
from autofit.memory_model import (
    Card,
    SpeedCalibration,
    calibrate_speed,
    measured_rates_card,
)
from autofit.rungs import QUALITY, RUNGS
from autofit.search._guide import MemoryGuide
from autofit.search._machine_rates import host_card, machine_rates
from autofit.search._result import Fit, Record
from autofit.search._slots import beside

log = logging.getLogger(__name__)

# Two timings of one or two steps closer than this are a tie [M: the 3% of the example ranked two fits the
# wrong way round; one-step timings of the same candidate on a shared CPU spread by 5-10%, 10 assumed].
SPEED_NOISE = 0.10
# The noise a search measures (a fit's probe against its own verification) counts up to this: beyond it the two
# timings disagree by more than any tie, and the machine's load changed under the search [A]
MAX_MEASURED_NOISE = 0.30


def measured_noise(probe: ProbeResult, verification: ProbeResult) -> float:
    """How far one configuration's two timings (its short probe and its longer verification) are apart, relative to
    the faster; 0 where either did not fit or has no timing."""
    a, b = probe.tokens_per_second, verification.tokens_per_second
    if not (probe.fits and verification.fits and a > 0 and b > 0):
        return 0.0
    return abs(a - b) / max(a, b)


VERIFIED_TIE = "two fits within the noise"  # how the note of a tie settled by verifying both begins


def _drops_a_quality_rung(fit: Fit, than: Fit) -> bool:
    """Whether ``than`` turns every rung ``fit`` turns and one more that costs quality (the drop pass's fit against
    the level it dropped an 8-bit optimizer from): a quality rung must buy speed the measurement can see, where a
    speed rung that times faster is simply faster."""
    mine, theirs = set(fit.candidate.rungs), set(than.candidate.rungs)
    return mine < theirs and any(getattr(RUNGS.get(name), "cost", None) == QUALITY for name in theirs - mine)


class SpeedJudge:
    """Which of two fits is faster: the measurement, unless it is within the noise and the model splits them."""

    def __init__(self, spec: SearchSpec, guide: MemoryGuide, notes: List[str],
                 records: Optional[List[Record]] = None):
        self.spec, self.guide = spec, guide  # the guide's shape: None when the memory model is off
        self.notes = notes  # the search's notes: a tie the model decides, or verification settles, is said there
        self.records = records if records is not None else []  # the search's timed probes: the model's calibration
        self._card: Optional[Card] = None
        self._card_known = False

    def card(self) -> Optional[Card]:
        if not self._card_known:
            self._card_known = True
            given = self.spec.options.gpu_memory
            if self.spec.device == "cuda":
                card = priced_card(given, self.spec.device)
                self._card = host_card(card, self.spec) if card is not None else None
            else:
                rates = machine_rates()
                self._card = measured_rates_card(*rates) if rates else None
        return self._card

    def comparable(self, fit: Fit, other: Fit) -> bool:
        """Whether the two timings were measured alike (``_slots``): both alone, or both beside other probes on
        GPUs of their own. Simulated devices on the CPU share its cores, so a timing beside others there compares
        with none."""
        crowded = beside(fit.result) > 0, beside(other.result) > 0
        return crowded == (False, False) or (crowded == (True, True) and self.spec.device == "cuda")

    def tied(self, fit: Fit, other: Fit, band: float = SPEED_NOISE) -> bool:
        """Within ``band`` of each other; or not timed alike (``comparable``), which are never ranked by their
        timings: the model splits them, or both are verified alone."""
        a, b = fit.result.tokens_per_second, other.result.tokens_per_second
        return a > 0 and b > 0 and (not self.comparable(fit, other) or abs(a - b) < band * max(a, b))

    def _calibration(self, fits: Sequence[Fit]) -> Optional[SpeedCalibration]:
        """The throughput model calibrated on the search's timed probes (``fits`` where there are none); None
        without a model or rates."""
        shape, card = self.guide.shape, self.card() if self.guide.shape is not None else None
        if shape is None or card is None:
            return None
        points = [(r.candidate, r.result.tokens_per_second) for r in self.records
                  if r.kind == "probe" and r.result.fits and r.result.tokens_per_second > 0
                  and (self.spec.device == "cuda" or not beside(r.result))]  # the CPU's cores were shared
        try:
            return calibrate_speed(points or [(f.candidate, f.result.tokens_per_second) for f in fits], shape, card)
        except (KeyError, ValueError, ZeroDivisionError) as exc:  # a configuration the model cannot describe
            log.debug("no speed calibration: %s", exc)
            return None

    def predicted(self, fit: Fit, than: Fit) -> Optional[Tuple[float, float, float]]:
        """(``fit``'s predicted tok/s, ``than``'s, the model's band); None without a model."""
        calibration = self._calibration([fit, than])
        if calibration is None:
            return None
        shape, card = self.guide.shape, self.card()
        assert shape is not None and card is not None  # a calibration has both
        try:
            mine, theirs = (calibration.predict(f.candidate, shape, card).tokens_per_second for f in (fit, than))
        except (KeyError, ValueError, ZeroDivisionError) as exc:
            log.debug("no speed prediction: %s", exc)
            return None
        return mine, theirs, calibration.uncertainty

    @staticmethod
    def _apart(mine: float, theirs: float) -> float:
        return max(mine, theirs) / min(mine, theirs) - 1 if min(mine, theirs) > 0 else 0.0

    def splits(self, fit: Fit, than: Fit) -> bool:
        """Whether the model predicts the two further apart than its band."""
        predicted = self.predicted(fit, than)
        return predicted is not None and self._apart(predicted[0], predicted[1]) > predicted[2]

    def faster(self, fit: Fit, than: Fit) -> bool:
        """Whether ``fit`` is faster than ``than``: measured, unless the timings tie and the model splits them
        beyond its band (then the model, and the notes say so)."""
        measured = fit.result.tokens_per_second > than.result.tokens_per_second
        predicted = self.predicted(fit, than) if self.tied(fit, than) else None
        if predicted is None:
            return measured
        mine, theirs, band = predicted
        if self._apart(mine, theirs) <= band or (mine > theirs) == measured:
            return measured
        winner, loser = (fit, than) if mine > theirs else (than, fit)
        card = self.card()
        note = (f"speed within the noise (±{SPEED_NOISE:.0%}): {winner.candidate.describe()} "
                f"({winner.result.tokens_per_second:,.0f} tok/s measured) against {loser.candidate.describe()} "
                f"({loser.result.tokens_per_second:,.0f}); the throughput model on {card.name if card else '?'} "
                f"predicts {self._apart(mine, theirs):.0%} more for the first, beyond its ±{band:.0%}, so it decides")
        if note not in self.notes:
            self.notes.append(note)
        return mine > theirs

    def rank(self, fits: List[Fit]) -> List[Fit]:
        """``fits`` sorted by measured speed, the first then replaced by a fit within the noise of it that the
        model predicts faster beyond its band (when the length is maximized: the longest first, then the fastest,
        measured)."""
        if self.spec.options.maximize == "length":
            return sorted(fits, key=lambda f: (f.candidate.max_length, f.result.tokens_per_second), reverse=True)
        ranked = sorted(fits, key=lambda f: f.result.tokens_per_second, reverse=True)
        if len(ranked) < 2:
            return ranked
        best = ranked[0]
        for fit in ranked[1:]:
            if self.tied(fit, ranked[0]) and self.faster(fit, best):
                best = fit
        return [best] + [f for f in ranked if f is not best]

    def rival(self, ranked: Sequence[Fit], band: float = SPEED_NOISE) -> Optional[Fit]:
        """The fastest measured fit after the first of ``ranked`` whose timing ties with it within ``band`` and that
        the model cannot split from it (at the same length, when the length is maximized); None when there is
        none."""
        if len(ranked) < 2:
            return None
        first = ranked[0]
        rivals = [f for f in ranked[1:] if f.candidate.key() != first.candidate.key() and self.tied(f, first, band)
                  and f.candidate.max_length == first.candidate.max_length and not self.splits(first, f)]
        return max(rivals, key=lambda f: f.result.tokens_per_second, default=None)

    def settle(self, ranked: List[Fit], verify: Callable[[Fit], ProbeResult]) -> List[Fit]:
        """``ranked`` with a tie the model cannot split settled by measuring longer: the first and its rival (see
        ``rival``) are both verified (``verify``: the verification run the chosen fit gets anyway) and the faster
        verified one that fits goes first, said in one note. Where no timing ties within the assumed noise, the
        first's own verification measures the noise (its spread from the first's probe) and a rival within that
        is verified too. Unchanged where there is no such tie."""
        band = SPEED_NOISE
        rival = self.rival(ranked)
        if rival is None and ranked and self.rival(ranked, MAX_MEASURED_NOISE) is not None:
            spread = measured_noise(ranked[0].result, verify(ranked[0]))  # the verification it gets anyway
            if spread > SPEED_NOISE:
                band = min(spread, MAX_MEASURED_NOISE)
                rival = self.rival(ranked, band)
        if rival is None:
            return ranked
        first = ranked[0]
        runs = [(fit, verify(fit)) for fit in (first, rival)]
        fitting = [(fit, run) for fit, run in runs if run.fits and run.tokens_per_second > 0]
        if not fitting:
            return ranked  # neither fits over the verification's steps: the search's loop says so for each
        (winner, won), (loser, lost) = sorted(runs, key=lambda p: (p[1].fits, p[1].tokens_per_second),
                                              reverse=True)
        spares_quality = lost.fits and _drops_a_quality_rung(loser, winner) and \
            abs(won.tokens_per_second - lost.tokens_per_second) < band * won.tokens_per_second
        if spares_quality:  # verified within the noise too: what the extra rung trades bought no measurable speed
            (winner, won), (loser, lost) = (loser, lost), (winner, won)
        steps = {run.steps for _, run in runs}
        over = f"{steps.pop()} steps" if len(steps) == 1 else f"{won.steps} and {lost.steps} steps"
        predicted = self.predicted(winner, loser)
        why = ("there is no throughput model to split them (--no-predict, or no rates)" if predicted is None else
               f"the throughput model predicts them {self._apart(predicted[0], predicted[1]):.0%} apart, inside its "
               f"±{predicted[2]:.0%}, so it cannot split them")
        against = (f"{lost.tokens_per_second:,.0f} for {loser.candidate.describe()}" if lost.fits else
                   f"{loser.candidate.describe()}, whose verification did not fit ({lost.outcome.value})")
        noise = (f"±{band:.0%}, the spread between {first.candidate.describe()}'s probe and its verification"
                 if band > SPEED_NOISE else f"±{SPEED_NOISE:.0%}")
        note = (f"{VERIFIED_TIE} ({noise}): {first.candidate.describe()}'s probe timed "
                f"{first.result.tokens_per_second:,.0f} tok/s, {rival.candidate.describe()}'s "
                f"{rival.result.tokens_per_second:,.0f}, and {why}: both verified over {over}, "
                f"{won.tokens_per_second:,.0f} tok/s for {winner.candidate.describe()} against {against}; " +
                ("still within the noise, so the one without the quality rung is chosen" if spares_quality else
                 "the faster verified is chosen"))
        if note not in self.notes:
            self.notes.append(note)
        log.info("%s", note)
        return [winner] + [f for f in ranked if f is not winner]
