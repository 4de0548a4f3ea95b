"""The estimate's first-step line for the algorithms that generate (GRPO, RLOO, PPO): the peak of step 1, before the
optimizer's states exist, against the peak from step 2 on, and which step would run out of memory
(``memory_model.step_peaks``): "fine at step 1, out of memory at step 2" is the failure GRPO users report most."""

from __future__ import annotations

from typing import Any, Optional

from autofit.cli._estimate_facts import phase_label, run_phases
from autofit.core import format_size
from autofit.memory_model import Calibration, ModelShape, step_peaks


def first_step_line(who: str, candidate: Any, shape: ModelShape, device: str, calibration: Optional[Calibration],
                    budget: float) -> str:
    """One line: ``who``'s step 1 and steady peaks, each at its phase, and the step that fails ``budget`` (if any)."""
    peaks = step_peaks(run_phases(candidate, shape, device, calibration), candidate)
    first, steady = peaks.first, peaks.steady
    when = ("as the optimizer's states are created" if first.phase == "step" else
            "before the optimizer's states exist")
    line = (f"{who}: step 1 peaks at {format_size(first.total)} at its {phase_label(first.phase)}, {when}; from "
            f"step 2, {format_size(steady.total)} at the {phase_label(steady.phase)}")
    failing = peaks.failing_step(budget)
    if failing == 1:
        return line + f": out of memory at step 1's {phase_label(first.phase)}"
    if failing == 2:
        return (line + f": step 1 runs in {format_size(budget)}, step 2 runs out of memory at its "
                f"{phase_label(steady.phase)}, once the optimizer's states exist")
    return line + f": both within {format_size(budget)}"
