"""A stored model read back is input (``autofit estimate --from DIR``): every figure of a calibration, its card and its
model shape is checked where it is rebuilt from best.json, so a scale of -1, NaN or a zero bandwidth is one line
naming the key instead of negative peaks that "fit" or a traceback."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Iterable, Mapping, Optional

# No stored figure is this large (a FLOP rate is ~1e16, a byte count ~1e14): 1e308 scales overflowed to NaN peaks.
MAX_FIGURE = 1e18
SCALE_LIMIT = 100.0  # a calibration scale or residual: a fraction of the model's figure, never a hundredfold


def check_figures(what: str, obj: Any, positive: Iterable[str] = (),
                  at_most: Optional[Mapping[str, float]] = None) -> None:
    """Every number of the dataclass ``obj`` finite, at least 0 and at most ``MAX_FIGURE`` (or its ``at_most``),
    those named in ``positive`` above 0, its int fields whole and its bool fields booleans; else ValueError naming
    ``what``'s key, its value and what is accepted."""
    must_be_positive = set(positive)
    for field in fields(obj):
        value, kind = getattr(obj, field.name), str(field.type)
        if value is None and "Optional" in kind:
            continue
        key = f"{what}.{field.name}"
        if kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{key} is {value!r}: expected true or false")
            continue
        if kind.replace("Optional[", "").rstrip("]") not in ("int", "float"):
            continue
        whole = "int" in kind
        number = isinstance(value, int if whole else (int, float)) and not isinstance(value, bool)
        strict = field.name in must_be_positive
        if not number or not math.isfinite(value) or (value <= 0 if strict else value < 0):
            accepted = "a whole number" if whole else "a finite number"
            raise ValueError(f"{key} is {value!r}: expected {accepted} {'> 0' if strict else '>= 0'}")
        limit = (at_most or {}).get(field.name, MAX_FIGURE)
        if value > limit:
            raise ValueError(f"{key} is {value!r}: expected at most {limit:g}")
