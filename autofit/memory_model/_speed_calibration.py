"""The throughput model calibrated on a search's own timed steps, as the ledger is on measured peaks
(``_calibration``): predicted seconds per optimizer step = compute_scale·compute + fixed_scale·fixed, where *fixed*
is the cost paid per micro-batch whatever its size (the kernel launches of every pass: on a GPU the part the device
waits for, ``_dispatch``; timings of which one has none of it get one scale) and *compute* everything else
(the passes' FLOPs and bytes, the optimizer, offload, generation). Timings at two or more micro-batch sizes separate
the two; otherwise one scale is fitted on the whole step. Kept in best.json under "speed_model" beside
"memory_model", with the card whose rates the model ran on, so ``autofit estimate --from DIR`` predicts with the
same rates and the same scales."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from autofit.core import Candidate, Card
from autofit.memory_model._calibration import _solve
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._speed_band import PRIOR_SPEED_UNCERTAINTY
from autofit.memory_model._stored_checks import SCALE_LIMIT, check_figures
from autofit.memory_model._throughput import SpeedEstimate, predict_speed

# paid once per micro-batch (or decode step), whatever its size
CARD_NAMES = ("device_names", "aliases")  # a card's other names: never stored, never read back
FIXED_TERMS = ("launch", "generation launches", "vLLM steps")
# One scale (a single timing, or timings at one micro-batch size) fits the step's absolute speed but leaves its
# ratios between configurations the prior's [A: make bench-speed measured checkpointing's ratio within 4% on the
# CPU meter; one-step timings of one candidate spread by 5-10% on a shared machine, so 20% is two such spreads].
SPEED_SCALE_UNCERTAINTY = 0.20
# Two terms: the largest residual of the fitted timings, at least a timing's own noise [M: one or two timed steps
# on a shared 2-core CPU spread by 5-10%; autofit.search._speed_tie's SPEED_NOISE].
SPEED_CALIBRATED_FLOOR = 0.10


@dataclass
class SpeedCalibration:
    """Scales fitted on measured tokens/s; ``method`` is "prior" (no timing), "scale" or "two-term". It belongs to one
    model, algorithm, device and card (its rates: a named GPU's published peaks, or the CPU meter's measured ones)."""

    compute_scale: float = 1.0
    fixed_scale: float = 1.0
    method: str = "prior"
    points: int = 0
    max_residual: float = 0.0  # the largest |predicted - measured| / measured step time over the fitted timings
    model: Optional[str] = None
    algo: Optional[str] = None
    device: Optional[str] = None
    card: Optional[Dict[str, Any]] = None  # the Card's fields

    @property
    def uncertainty(self) -> float:
        if self.points == 0:
            return PRIOR_SPEED_UNCERTAINTY
        if self.method != "two-term":
            return max(SPEED_SCALE_UNCERTAINTY, self.max_residual)
        return max(SPEED_CALIBRATED_FLOOR, self.max_residual)

    def card_of(self) -> Optional[Card]:
        return Card(**{k: v for k, v in self.card.items() if k not in CARD_NAMES}) if self.card else None

    def mismatch(self, candidate: Candidate, card: Optional[Card] = None) -> Optional[str]:
        """What this calibration was made for that ``candidate`` (on ``card``) is not, or None when it applies."""
        named = self.card.get("name") if self.card else None
        differ = [f"{what} {mine}" for what, mine, theirs in (
            ("model", self.model, candidate.model), ("algo", self.algo, candidate.algo),
            ("device", self.device, candidate.device), ("card", named, card.name if card else named))
            if mine is not None and mine != theirs]
        return ", ".join(differ) or None

    def predict(self, candidate: Candidate, shape: ModelShape, card: Card) -> SpeedEstimate:
        """The calibrated estimate with its band (the prior's when nothing was timed)."""
        prior = predict_speed(candidate, shape, card)
        if self.points == 0:
            return prior
        terms = {name: seconds * (self.fixed_scale if name in FIXED_TERMS else self.compute_scale)
                 for name, seconds in prior.terms.items()}
        return SpeedEstimate(sum(terms.values()), prior.tokens_per_step, self.uncertainty, terms, prior.ranks,
                             prior.notes)

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["uncertainty"] = self.uncertainty  # informative; recomputed on load
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpeedCalibration:
        names = {f.name for f in fields(cls)}
        calibration = cls(**{k: v for k, v in data.items() if k in names})
        check_figures("speed_model", calibration, positive=("compute_scale", "fixed_scale"),
                      at_most=dict.fromkeys(("compute_scale", "fixed_scale"), SCALE_LIMIT))
        if calibration.method not in ("prior", "scale", "two-term"):
            raise ValueError(f"speed_model.method is {calibration.method!r}: expected prior, scale or two-term")
        if calibration.card is not None:
            card = calibration.card_of()  # a card that cannot be rebuilt is refused here (TypeError)
            check_figures("speed_model.card", card, positive=("flops", "bandwidth", "host_link", "gpu_link",
                                                              "half_rows"))
        return calibration


def _card_rates(card: Card) -> Dict[str, Any]:
    """The card as best.json keeps it: its name, rates and memory; the names NVML gives it are the table's."""
    return {k: v for k, v in asdict(card).items() if k not in CARD_NAMES}


def _parts(estimate: SpeedEstimate) -> Tuple[float, float]:
    fixed = sum(seconds for name, seconds in estimate.terms.items() if name in FIXED_TERMS)
    return estimate.seconds_per_step - fixed, fixed


def calibrate_speed(points: Sequence[Tuple[Candidate, float]], shape: ModelShape, card: Card) -> SpeedCalibration:
    """Fit the scales on (candidate, measured tokens/s) of one model/algo/device: one scale on the step time (least
    squares on the relative errors), or, when the timings span two or more micro-batch sizes and it fits
    them better with both scales positive, weighted least squares on the compute and fixed parts."""
    timed = [(c, float(tps)) for c, tps in points if tps and tps > 0]
    if not timed:
        return SpeedCalibration(card=_card_rates(card))
    estimates = [predict_speed(c, shape, card) for c, _ in timed]
    measured = [e.tokens_per_step / tps for e, (_, tps) in zip(estimates, timed, strict=True)]  # seconds per step
    parts = [_parts(e) for e in estimates]
    ratios = [(c + f) / y for (c, f), y in zip(parts, measured, strict=True)]
    k = sum(ratios) / sum(r * r for r in ratios)  # one scale, least squares on the relative errors
    scales, method = (k, k), "scale"
    if len({c.micro_batch for c, _ in timed}) >= 2 and all(f > 0 for _, f in parts):
        two = _solve(parts, measured)
        if two is not None and _residual(parts, measured, *two) <= _residual(parts, measured, *scales):
            scales, method = two, "two-term"
    first = timed[0][0]
    devices = {c.device for c, _ in timed}
    return SpeedCalibration(compute_scale=scales[0], fixed_scale=scales[1], method=method, points=len(timed),
                            max_residual=_residual(parts, measured, *scales), model=first.model, algo=first.algo,
                            device=devices.pop() if len(devices) == 1 else None, card=_card_rates(card))


def _residual(parts: Sequence[Tuple[float, float]], measured: Sequence[float], a: float, b: float) -> float:
    return float(max(abs(a * c + b * f - y) / y for (c, f), y in zip(parts, measured, strict=True)))
