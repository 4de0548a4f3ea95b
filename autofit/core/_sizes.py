"""Memory sizes: parsed from what a user writes, formatted for every message."""

from __future__ import annotations

import re
from typing import Optional

from autofit.core._errors import InputError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}


def parse_size(text: str) -> int:
    """'24GiB', '80GB', '512MiB', '1.5g' -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    nbytes = int(float(match.group(1)) * _UNITS[unit]) if match and unit in _UNITS else 0
    if nbytes <= 0:
        raise InputError(f"memory size '{text}' is not valid: use a positive number with a unit, e.g. 24GiB, 80GB, "
                         "512MiB")
    return nbytes


def format_size(nbytes: Optional[float]) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"
