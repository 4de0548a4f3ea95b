"""Memory sizes: parsed from what a user writes (a size with a unit, or a GPU by its name), formatted for every
message (in GiB from 1 GiB up)."""

from __future__ import annotations

import re
from typing import Optional

from autofit.core._cards import CARDS, card_key, card_named
from autofit.core._errors import InputError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}


# GPUs by name: the memory the driver reports (nvidia-smi's "MiB" total), what a search on the card itself takes as
# its budget. "80GB" is 10**9 bytes (74.51 GiB): planning for an "80 GB" card by that number gives up 5 GiB [M: the
# cards' usual nvidia-smi totals; the H100's as measured on 2026-11-22, 81,559 MiB].
AMBIGUOUS = {"A100": ("A100-40GB", "A100-80GB"), "V100": ("V100-32GB",)}


def card_names() -> str:
    return ", ".join(CARDS)


def parse_size(text: str) -> int:
    """'24GiB', '80GB', '512MiB', '1.5g', or a GPU's name ('H100', 'A100-80GB') -> bytes."""
    card = card_named(str(text))
    if card is not None:
        return card.memory_mib * 2**20
    key = card_key(str(text))
    for name, choices in AMBIGUOUS.items():
        if key == card_key(name):
            raise InputError(f"memory size '{text}' names cards of different sizes: accepted are {', '.join(choices)}")
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    nbytes = int(float(match.group(1)) * _UNITS[unit]) if match and unit in _UNITS else 0
    if nbytes <= 0:
        raise InputError(f"memory size '{text}' is not valid: use a positive number with a unit, e.g. 24GiB, 80GB, "
                         f"512MiB, or a GPU's name ({card_names()})")
    return nbytes


def format_size(nbytes: Optional[float]) -> str:
    if nbytes is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"
