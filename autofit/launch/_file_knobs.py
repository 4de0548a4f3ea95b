"""What the knob table (``autofit.core.KNOBS``) reads of a TRL file: the search's options it sets, the baseline's
settings, the keys its readers consume, and the file's key behind each option."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from autofit.core import KNOBS, FileRun


def file_options(run: FileRun) -> Dict[str, Any]:
    """The search's options a TRL file sets, by ``SearchOptions`` field name."""
    values: Dict[str, Any] = {}
    for k in KNOBS:
        if k.options is not None:
            values.update(k.options(run))
    return values


def file_baseline(run: FileRun) -> Tuple[Tuple[str, Any], ...]:
    """The candidate's fields the file's run starts from (the ladder's first level), as (field, value)."""
    settings: Dict[str, Any] = {}
    for k in KNOBS:
        if k.baseline is not None:
            settings.update(k.baseline(run))
    return tuple(settings.items())


def read_keys() -> Tuple[str, ...]:
    """The file's keys the knobs' readers consume."""
    return tuple(key for k in KNOBS for key in k.reads)


def option_file_keys() -> Dict[str, str]:
    return {option: key for k in KNOBS for option, key in k.option_keys.items()}
