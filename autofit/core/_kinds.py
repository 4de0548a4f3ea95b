"""What one option accepts (a ``Kind``): it checks a Python value (the ``fit`` door) and parses the command line's
text (``parse``), so that the two doors cannot accept different things; a refusal ends with the kind's ``phrase``.
The kinds of ``SearchOptions``' fields (``autofit.core._options``) are declared here, each once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Tuple, Union

from autofit.core._errors import InputError
from autofit.core._sizes import parse_size

AUTO_VERIFY = "auto"
MIN_BUDGET_BYTES = 2**20
# Probes handed out at once: the search keeps one slot per worker (a list of that length), so 10**20 hung it; 1024
# workers are more GPUs than any search's ladder has probes for (docs/decisions.md)
MAX_WORKERS = 1024
_WHOLE = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class Kind:
    """What one option accepts: ``accepts`` checks a value, ``parse`` turns the command line's text into one (None:
    the text itself), ``phrase`` ends the one-line message of a value it refuses."""

    phrase: str
    accepts: Callable[[Any], bool]
    parse: Optional[Callable[[str], Any]] = None
    explain: Optional[Callable[[Any], Optional[str]]] = None  # a refusal's own words, where ``phrase`` says too little


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _utf8(value: Any) -> bool:
    try:
        str(value).encode("utf-8")
    except UnicodeEncodeError:  # bytes the command line could not decode, kept as lone surrogates
        return False
    return True


def _not_utf8(value: Any) -> Optional[str]:
    if _utf8(value):
        return None
    return ("it holds bytes that are not UTF-8; best.yaml, best.json and the study are UTF-8 text and could not name "
            "it: rename it")


def whole(text: str) -> int:
    """A whole number as a person types it: ASCII digits, an optional sign, spaces around. Python's ``int`` also reads
    ``1_0`` as 10 and other scripts' digits (``\u0661``): a typo read as another device or count is refused instead."""
    if not _WHOLE.fullmatch(text.strip()):
        raise ValueError(f"not a whole number: {text!r}")
    return int(text)


def _gpu_count(text: str) -> Union[int, str]:
    return "all" if text.strip().lower() == "all" else whole(text)


def _device_ids(text: str) -> Tuple[int, ...]:
    return tuple(whole(word) for word in text.split(","))


def _distinct_indices(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and bool(value) and all(_is_int(v) and v >= 0 for v in value)
            and len(set(value)) == len(value))


def _verify_steps(text: str) -> Union[int, str]:
    return AUTO_VERIFY if text == AUTO_VERIFY else whole(text)


def _size(value: Any) -> bool:
    if isinstance(value, str):
        try:
            return parse_size(value) >= MIN_BUDGET_BYTES
        except InputError:
            return False
    return _is_int(value) and value >= MIN_BUDGET_BYTES


def _which_card(value: Any) -> Optional[str]:
    """The words of a card name that fits several cards ("A100": 40 or 80 GB)."""
    if isinstance(value, str):
        try:
            parse_size(value)
        except InputError as exc:
            if "cards of different sizes" in str(exc):
                return str(exc).split(": ", 1)[1]
    return None


def one_of(choices: Sequence[str]) -> Kind:
    return Kind(f"accepted are {', '.join(choices)}", lambda v: v in choices)


TEXT = Kind("a non-empty string is accepted", lambda v: isinstance(v, str) and bool(v) and _utf8(v),
            explain=_not_utf8)
FLAG = Kind("True or False is accepted", lambda v: isinstance(v, bool))
POSITIVE_INT = Kind("a positive integer is accepted", lambda v: _is_int(v) and v >= 1, whole)
WORKERS = Kind(f"a whole number of workers from 1 to {MAX_WORKERS} is accepted",
               lambda v: _is_int(v) and 1 <= v <= MAX_WORKERS, whole)
MAX_STEPS = 1000  # a probe or check run measures memory and speed; far more steps add hours, not answers
PROBE_STEPS = Kind(f"a probe needs at least 2 optimizer steps, and at most {MAX_STEPS}",
                   lambda v: _is_int(v) and 2 <= v <= MAX_STEPS, whole)
GENERATIONS = Kind("GRPO/RLOO need at least 2 completions per prompt to compare them",
                   lambda v: _is_int(v) and v >= 2, whole)
SECONDS = Kind("a positive, finite number of seconds is accepted", lambda v: _is_number(v) and 0 < v < math.inf,
               float)
# vLLM's CacheConfig.gpu_memory_utilization is Field(gt=0, le=1): the whole card is a share vLLM takes
SHARE = Kind("a share of the GPU above 0 and at most 1 is accepted (vLLM's gpu_memory_utilization)",
             lambda v: _is_number(v) and 0 < v <= 1, float)
HEADROOM = Kind("use a fraction from 0 to 0.5, e.g. 0.03", lambda v: _is_number(v) and 0 <= v < 0.5, float)
BETA = Kind("a finite number, 0 or more, is accepted", lambda v: _is_number(v) and math.isfinite(v) and v >= 0,
            float)
SIZE = Kind("give a size with a unit, e.g. '24GiB' or '1.5GiB', a GPU's name (H100, A100-80GB, L4, RTX4090, ...) or "
            "an integer number of bytes, not below 1 MiB", _size, explain=_which_card)
GPUS = Kind("a positive number of GPUs or 'all' is accepted", lambda v: v == "all" or (_is_int(v) and v >= 1),
            _gpu_count)
DEVICE_IDS = Kind("distinct device indices are accepted, comma-separated, e.g. 0,1,2,3 (or a list in fit())",
                  _distinct_indices, _device_ids)
VERIFY_STEPS = Kind(f"use a whole number from 1 to {MAX_STEPS}, or 'auto'",
                    lambda v: v == AUTO_VERIFY or (_is_int(v) and 1 <= v <= MAX_STEPS), _verify_steps)
LADDER = Kind("rung names are accepted, comma-separated (or a list in fit())",
              lambda v: isinstance(v, str) or (isinstance(v, (list, tuple)) and all(isinstance(n, str) for n in v)))
FOLDER = Kind("a folder path is accepted", lambda v: isinstance(v, (str, Path)) and str(v) != "" and _utf8(v),
              explain=_not_utf8)
ARGS = Kind("a dict of config fields is accepted", lambda v: isinstance(v, dict))
WORDS = Kind("a list of command-line words (strings) is accepted",
             lambda v: isinstance(v, (list, tuple)) and all(isinstance(w, str) for w in v))
