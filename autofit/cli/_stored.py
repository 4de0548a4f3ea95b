"""``autofit estimate --from DIR``: the calibrated memory model a search stored in ``DIR/best.json``, read back for the
estimate where it applies to the question (the same model, algorithm and device)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Tuple

from autofit.core import InputError, SearchSpec, one_line
from autofit.memory_model import PRIOR_UNCERTAINTY, Calibration

MEMORY_MODEL_KEY = "memory_model"  # best.json key of a calibrated model (Calibration.to_dict())


def load_calibration(from_dir: Optional[str], spec: SearchSpec) -> Tuple[Optional[Calibration], List[str]]:
    """The calibrated model stored in ``from_dir/best.json`` when it applies to ``spec``; else None and a note."""
    if not from_dir:
        return None, []
    path = Path(from_dir) / "best.json"
    prior = f"using the uncalibrated prior (±{PRIOR_UNCERTAINTY:.0%})"
    if not path.is_file():
        return None, [f"{path} does not exist: {prior}"]
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested beyond any best.json
        raise InputError(f"--from {path} cannot be read ({type(exc).__name__}: {one_line(exc)}): run the search "
                         "again, or drop --from to use the uncalibrated model") from None
    stored = data.get(MEMORY_MODEL_KEY) if isinstance(data, dict) else None
    if not stored:
        return None, [f"{path} has no calibrated memory model ('{MEMORY_MODEL_KEY}'): {prior}"]
    try:
        calibration = Calibration.from_dict(stored)
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise InputError(f"--from {path}: its memory model cannot be read ({type(exc).__name__}: {exc}): run the "
                         "search again, or drop --from") from None
    mismatch = [f"{name} {mine}" for name, mine, theirs in (
        ("model", calibration.model, spec.options.model), ("algo", calibration.algo, spec.options.algo),
        ("device", calibration.device, spec.device)) if mine is not None and mine != theirs]
    if mismatch:
        return None, [f"{path} was calibrated for {', '.join(mismatch)}: {prior}"]
    note = (f"calibrated on {calibration.points} probe(s) from {path} (static x{calibration.static_scale:.3f}, "
            f"dynamic x{calibration.dynamic_scale:.3f}, ±{calibration.uncertainty:.0%})")
    return calibration, [note]
