"""What ``autofit estimate`` computes for one card, once: the question, the levels of the ladder and their speeds, the
notes, and the user's run phase by phase. The text (``_estimate``) and the JSON (``_estimate_json``) are both drawn
from these objects, so the two never disagree."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, List, Optional, Sequence, Tuple

from autofit.cli._speed import fastest_first, level_speeds
from autofit.core import DEFAULT_ALGO, SearchSpec
from autofit.memory_model import (
    Calibration,
    Ledger,
    ModelShape,
    RungEstimate,
    SpeedEstimate,
    expected_rung,
    phase_ledgers,
    rung_notes,
    sizes_are_exact,
    start_state,
    unchecked_reason,
    vllm_lines,
)
from autofit.rungs import resolve_ladder, usable_rungs

# The ledger's phases in the order a run goes through them (``autofit.memory_model._ledger``), and their names for a
# reader. The ledger's forward peaks at the LM head, where every saved activation is live and the head's buffers
# join: "train" is the forward and the LM head, its terms apart (activations: the forward's, logits: the head's).
PHASE_ORDER = ("engine_setup", "first_backward", "weight_sync", "generation", "scoring", "train", "backward", "step")
PHASE_LABELS = {
    "engine_setup": "engine setup",
    "weight_sync": "weight sync",
    "generation": "generation",
    "scoring": "scoring",
    "train": "forward + LM head",
    "first_backward": "first backward",
    "backward": "backward",
    "step": "optimizer step",
}


def phase_label(name: str) -> str:
    return PHASE_LABELS.get(name, name.replace("_", " "))


@dataclass(frozen=True)
class CardEstimate:
    """One card's estimate: ``card`` as ``--gpu-memory`` gave it, the question, the levels (``result``), each level's
    predicted speed (None without a named card), the rungs left out and the ladder's notes, and ``run_phases``: the
    user's run (``--config``, the ladder's level 0) at each phase of its step, in order (empty without a file)."""

    card: str
    spec: SearchSpec
    shape: ModelShape
    calibration: Optional[Calibration]
    notes: Tuple[str, ...]  # the estimate's own (--from), after the question's
    result: RungEstimate
    speeds: Optional[List[SpeedEstimate]]
    left_out: Tuple[str, ...]
    ladder_notes: Tuple[str, ...]
    vllm: Tuple[str, ...]
    run_phases: Tuple[Ledger, ...]
    plot: Optional[str] = None

    @property
    def budget(self) -> int:
        budget = self.spec.budget_bytes
        assert budget is not None  # an estimate's question always has one (estimate_question)
        return budget

    @property
    def unchecked(self) -> Optional[str]:
        """Why the band is widened (a family or algorithm the prior was not checked on); None when calibrated."""
        return unchecked_reason(self.shape, self.spec.options.algo) if self.calibration is None else None

    def question_notes(self) -> List[str]:
        """The notes on the question and the model (printed before the user's run)."""
        unchecked = [f"{self.unchecked}: the band is widened; a search's probes calibrate it"] if self.unchecked else []
        return [*unchecked, *self.spec.notes, *self.notes]

    def all_notes(self) -> List[str]:
        """Every note the text prints as ``note: ...``: the question's, the ladder's (the rungs left out, what the
        rungs say), then the speed's (what its prediction does not price)."""
        speed_notes = self.speeds[0].notes if self.speeds else ()
        return [*self.question_notes(), *self.left_out, *self.ladder_notes, *speed_notes]

    def fastest_fits(self) -> List[Tuple[SpeedEstimate, Any]]:
        """(speed, level) of the levels predicted to fit, fastest first (``_speed.fastest_first``); empty without a
        named card."""
        return fastest_first(self.speeds, self.result.levels, self.budget) if self.speeds is not None else []


def card_estimate(spec: SearchSpec, calibration: Optional[Calibration] = None, notes: Sequence[str] = (),
                  result: Optional[RungEstimate] = None, card: Optional[str] = None,
                  plot: Optional[str] = None) -> CardEstimate:
    """Everything the estimate of one card says, computed once."""
    budget = spec.budget_bytes
    assert budget is not None  # an estimate's question always has one (estimate_question)
    result = result or expected_rung(spec, budget, calibration=calibration)
    shape = ModelShape.from_model(spec.options.model)
    usable, left_out = usable_rungs(resolve_ladder(spec.ladder), spec.device, start_state(spec, shape))
    phases = run_phases(result.levels[0].candidate, shape, spec.device, calibration) if spec.baseline else ()
    return CardEstimate(card=str(card if card is not None else spec.options.gpu_memory), spec=spec, shape=shape,
                        calibration=calibration, notes=tuple(notes), result=result,
                        speeds=level_speeds(spec, shape, result.levels), left_out=tuple(left_out),
                        ladder_notes=tuple(rung_notes(usable)), vllm=tuple(vllm_lines(spec, shape)),
                        run_phases=phases, plot=plot)


def run_phases(candidate: Any, shape: ModelShape, device: str, calibration: Optional[Calibration] = None
               ) -> Tuple[Ledger, ...]:
    """The candidate's ledger at each phase of its step, in the order the run goes through them, scaled as its level's
    peak is where ``calibration`` applies (``Calibration.predict_calibrated``)."""
    if calibration is not None and calibration.shape is not None:  # the shape the levels were predicted on
        shape = calibration.shape
    ledgers = phase_ledgers(candidate, shape, device=device)
    if calibration is not None and calibration.points and calibration.applies_to(candidate):
        ledgers = [ledger.scaled(calibration.static_scale, calibration.dynamic_scale, calibration.uncertainty)
                   for ledger in ledgers]
        totals = {ledger.phase: ledger.total for ledger in ledgers}
        ledgers = [replace(ledger, phase_totals=totals) for ledger in ledgers]
    rank = {name: index for index, name in enumerate(PHASE_ORDER)}
    return tuple(sorted(ledgers, key=lambda ledger: rank.get(ledger.phase, len(PHASE_ORDER))))


def parameters_line(shape: ModelShape, algo: str = DEFAULT_ALGO) -> str:
    """The parameter count of the model ``algo`` trains (a reward model: the score head instead of the LM head)."""
    census = shape.parameters().for_algo(algo)
    where = "counted from the model" if census.source == "meta" else "computed from the configuration"
    if census.source != "meta" and sizes_are_exact(shape):
        where += " (exact for this family)"
    experts = f", {census.experts:,} of them in {shape.experts} experts per layer" if shape.experts else ""
    return f"{census.total:,} parameters {where}{experts}"
