"""A stored model read back is input (``autofit estimate --from DIR``): every figure of a calibration, its card and its
model shape is checked where it is rebuilt from best.json, so a scale of -1, NaN or a zero bandwidth is one line
naming the key instead of negative peaks that "fit" or a traceback."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Iterable


def check_figures(what: str, obj: Any, positive: Iterable[str] = ()) -> None:
    """Every number of the dataclass ``obj`` finite and at least 0, those named in ``positive`` above 0, its int
    fields whole and its bool fields booleans; else ValueError naming ``what``'s key, its value and what is
    accepted."""
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
