"""Calibration: scales on the ledger's static and dynamic parts, fitted by least squares on measured peaks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from autofit.core import Candidate
from autofit.memory_model._activations import train_tokens
from autofit.memory_model._ledger import PRIOR_UNCERTAINTY, Ledger, phase_ledgers, predict
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._stored_checks import SCALE_LIMIT, check_figures

# With calibration: the largest relative residual of the fitted points, at least this floor [A] ...
CALIBRATED_UNCERTAINTY_FLOOR = 0.03
# ... and with one scale (a single point, fitted exactly, or points at one token count: their residual says nothing
# about other sizes) [A].
SINGLE_POINT_UNCERTAINTY = 0.10


@dataclass
class Calibration:
    """Scales fitted on measured probes: calibrated peak = static_scale·static + dynamic_scale·dynamic, per phase.

    ``method`` is "prior" (no points: scales 1), "scale" (one scale on everything: one point, or points that cannot
    separate the two parts) or "two-term" (least squares on two or more points at different token counts).
    The calibration belongs to one model, algorithm and device; ``shape`` is kept so it needs no registry."""

    static_scale: float = 1.0
    dynamic_scale: float = 1.0
    method: str = "prior"
    points: int = 0
    max_residual: float = 0.0  # the largest |predicted - measured| / measured over the fitted points
    model: Optional[str] = None
    algo: Optional[str] = None
    device: Optional[str] = None
    shape: Optional[ModelShape] = None

    @property
    def uncertainty(self) -> float:
        if self.points == 0:
            return PRIOR_UNCERTAINTY
        if self.method != "two-term":  # one scale: a single point, or points at one token count
            return max(SINGLE_POINT_UNCERTAINTY, self.max_residual)
        return max(CALIBRATED_UNCERTAINTY_FLOOR, self.max_residual)

    def applies_to(self, candidate: Candidate) -> bool:
        return all(mine is None or mine == theirs for mine, theirs in
                   ((self.model, candidate.model), (self.algo, candidate.algo), (self.device, candidate.device)))

    def predict_calibrated(self, candidate: Candidate, *, device: Optional[str] = None) -> Ledger:
        """The calibrated ledger at the peak phase (phases compared after scaling)."""
        ledgers = phase_ledgers(candidate, self.shape, device=device)
        scaled = [self._scale(ledger) for ledger in ledgers]
        totals = {ledger.phase: ledger.total for ledger in scaled}
        return replace(max(scaled, key=lambda ledger: ledger.total), phase_totals=totals)

    def _scale(self, ledger: Ledger) -> Ledger:
        if self.points == 0:  # the prior: its band is the family's (wider where unchecked)
            return ledger
        return ledger.scaled(self.static_scale, self.dynamic_scale, self.uncertainty)

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["shape"] = self.shape.to_dict() if self.shape is not None else None
        data["uncertainty"] = self.uncertainty  # informative; recomputed on load
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if values.get("shape") is not None:
            values["shape"] = ModelShape.from_dict(values["shape"])
        calibration = cls(**values)
        check_figures("memory_model", calibration, positive=("static_scale", "dynamic_scale"),
                      at_most=dict.fromkeys(("static_scale", "dynamic_scale", "max_residual"), SCALE_LIMIT))
        if calibration.method not in ("prior", "scale", "two-term"):
            raise ValueError(f"memory_model.method is {calibration.method!r}: expected prior, scale or two-term")
        return calibration


def _solve(parts: Sequence[Tuple[float, float]], measured: Sequence[float]) -> Optional[Tuple[float, float]]:
    """Weighted least squares (weights 1/y², i.e. relative errors) for y ≈ a·S + b·D; None if degenerate."""
    sss = ssd = sdd = ssy = sdy = 0.0
    for (s, d), y in zip(parts, measured, strict=True):
        w = 1.0 / (y * y)
        sss += w * s * s
        ssd += w * s * d
        sdd += w * d * d
        ssy += w * s * y
        sdy += w * d * y
    det = sss * sdd - ssd * ssd
    if det <= 1e-12 * max(sss * sdd, 1e-300):  # the points do not separate the two parts
        return None
    a = (ssy * sdd - sdy * ssd) / det
    b = (sss * sdy - ssd * ssy) / det
    return (a, b) if a > 0 and b > 0 else None


def calibrate(points: Sequence[Tuple[Candidate, float]], shape: Optional[ModelShape] = None, *,
              device: Optional[str] = None) -> Calibration:
    """Fit the static and dynamic scales on measured (candidate, peak bytes) points of one model/algo/device.

    Each point is decomposed at its peak phase (chosen again with the fitted scales until it is stable). Points at
    two or more token counts fit both scales; otherwise one scale is fitted. (Two points at the same token count,
    checkpointing on and off say, differ in their dynamic part only by the ledger's recomputation model: a
    two-term fit on them extrapolates that model's error to every other size, 9% off in the benchmark.)"""
    points = [(c, float(y)) for c, y in points if y and y > 0]
    if not points:
        return Calibration(shape=shape)
    first = points[0][0]
    shape = shape or ModelShape.from_model(first.model)
    phases = [phase_ledgers(c, shape, device=device) for c, _ in points]
    measured = [y for _, y in points]
    one = _fit(phases, measured, two_term=False)
    assert one is not None  # one scale is never degenerate
    (a, b), method = one, "scale"
    if len({train_tokens(c) for c, _ in points}) >= 2:
        # Both scales when the points separate them, unless the solution is not a model of memory (a scale at or
        # under zero: static parts that barely differ, dynamic parts out of order, as checkpointing's recompute
        # model can put them) or it fits the points worse than one scale does.
        two = _fit(phases, measured, two_term=True)
        if two is not None and _residual(phases, measured, *two) <= _residual(phases, measured, a, b):
            (a, b), method = two, "two-term"
    residual = _residual(phases, measured, a, b)
    devices = {device or c.device for c, _ in points}
    return Calibration(
        static_scale=a, dynamic_scale=b, method=method, points=len(points), max_residual=residual,
        model=first.model, algo=first.algo, device=devices.pop() if len(devices) == 1 else None, shape=shape,
    )


def _fit(phases: Sequence[Sequence[Ledger]], measured: Sequence[float], two_term: bool
         ) -> Optional[Tuple[float, float]]:
    """The scales, each point decomposed at the phase that peaks under them (chosen again until it is stable);
    None when the two-term fit is degenerate or not positive."""
    a = b = 1.0
    for _ in range(6):
        peaks = [max(ledgers, key=lambda ledger: a * ledger.static + b * ledger.dynamic) for ledgers in phases]
        parts = [(ledger.static, ledger.dynamic) for ledger in peaks]
        if two_term:
            new = _solve(parts, measured)
            if new is None or min(new) <= 0:
                return None
        else:  # one scale on the whole prediction
            ratios = [(s + d) / y for (s, d), y in zip(parts, measured, strict=True)]
            k = sum(ratios) / sum(r * r for r in ratios)
            new = (k, k)
        if abs(new[0] - a) <= 1e-12 * a and abs(new[1] - b) <= 1e-12 * b:
            break
        a, b = new
    return a, b


def _residual(phases: Sequence[Sequence[Ledger]], measured: Sequence[float], a: float, b: float) -> float:
    fitted = [max(a * ledger.static + b * ledger.dynamic for ledger in ledgers) for ledgers in phases]
    return float(max(abs(p - y) / y for p, y in zip(fitted, measured, strict=True)))


def predict_calibrated(candidate: Candidate, calibration: Optional[Calibration] = None,
                       shape: Optional[ModelShape] = None) -> Ledger:
    """The calibrated ledger when ``calibration`` applies to the candidate, else the prior's."""
    if calibration is None or calibration.points == 0 or not calibration.applies_to(candidate):
        return predict(candidate, shape)
    if calibration.shape is None:
        calibration = replace(calibration, shape=shape or ModelShape.from_model(candidate.model))
    return calibration.predict_calibrated(candidate)
