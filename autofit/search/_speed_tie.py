"""Where two fits' measured speeds differ by less than the machine's noise, the throughput model decides (issue 37,
item 3): a probe times one or two steps, and on a busy machine the slower of two fits can time a few percent faster
(in ``make bench``'s tight budget for tiny-qwen2, mb=4x2 with checkpointing timed 3% faster than mb=2x4 without it;
over ten steps the plain one was 19% faster). The prediction runs on a named card's published rates on CUDA, and on
the CPU meter on this machine's own, measured once in a child process (the search never imports torch)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

from autofit.core import SearchSpec
from autofit.memory_model import Card, card_named, measured_rates_card, predict_speed
from autofit.search._guide import MemoryGuide
from autofit.search._result import Fit

log = logging.getLogger(__name__)

# Two timings of one or two steps closer than this are a tie [M: the 3% of the example ranked two fits the
# wrong way round; one-step timings of the same candidate on a shared CPU spread by 5-10%, 10 assumed].
SPEED_NOISE = 0.10
_RATES: Dict[str, Optional[Tuple[float, float]]] = {}


def machine_rates() -> Optional[Tuple[float, float]]:
    """This machine's (FLOP/s, bytes/s), measured once per search process by ``autofit.probe._rates``; None where it
    cannot run (the tie then stays with the measurement)."""
    if "cpu" not in _RATES:
        try:
            done = subprocess.run([sys.executable, "-m", "autofit.probe._rates"], capture_output=True, text=True,
                                  timeout=120, check=True)
            rates = json.loads(done.stdout.strip().splitlines()[-1])
            _RATES["cpu"] = (float(rates["flops"]), float(rates["bandwidth"]))
        except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError) as exc:
            log.info("this machine's rates could not be measured (%s): ties of speed stay with the timing", exc)
            _RATES["cpu"] = None
    return _RATES["cpu"]


class SpeedJudge:
    """Which of two fits is faster: the measurement, unless it is within the noise and the model can tell."""

    def __init__(self, spec: SearchSpec, guide: MemoryGuide, notes: List[str]):
        self.spec, self.guide = spec, guide  # the guide's shape: None when the memory model is off
        self.notes = notes  # the search's notes: a tie the model decides is said there
        self._card: Optional[Card] = None
        self._card_known = False

    def card(self) -> Optional[Card]:
        if not self._card_known:
            self._card_known = True
            given = self.spec.options.gpu_memory
            if self.spec.device == "cuda":
                self._card = card_named(given) if isinstance(given, str) else None
            else:
                rates = machine_rates()
                self._card = measured_rates_card(*rates) if rates else None
        return self._card

    def tied(self, fit: Fit, other: Fit) -> bool:
        a, b = fit.result.tokens_per_second, other.result.tokens_per_second
        return a > 0 and b > 0 and abs(a - b) < SPEED_NOISE * max(a, b)

    def faster(self, fit: Fit, than: Fit) -> bool:
        """Whether ``fit`` is faster than ``than``; a tie the model breaks is noted."""
        measured = fit.result.tokens_per_second > than.result.tokens_per_second
        shape = self.guide.shape
        if shape is None or not self.tied(fit, than) or self.card() is None:
            return measured
        card = self.card()
        assert card is not None
        mine, theirs = (predict_speed(f.candidate, shape, card).tokens_per_second for f in (fit, than))
        if mine == theirs or (mine > theirs) == measured:
            return measured
        winner, loser = (fit, than) if mine > theirs else (than, fit)
        note = (f"speed within the noise (±{SPEED_NOISE:.0%}): {winner.candidate.describe()} "
                f"({winner.result.tokens_per_second:,.0f} tok/s measured) against {loser.candidate.describe()} "
                f"({loser.result.tokens_per_second:,.0f}); the throughput model on {card.name} predicts "
                f"{max(mine, theirs) / min(mine, theirs) - 1:.0%} more for the first, so it decides")
        if note not in self.notes:
            self.notes.append(note)
        return mine > theirs

    def rank(self, fits: List[Fit]) -> List[Fit]:
        """``fits`` sorted by measured speed, the first then replaced by a fit within the noise of it that the
        model predicts faster (when the length is maximized: the longest first, then the fastest, measured)."""
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
