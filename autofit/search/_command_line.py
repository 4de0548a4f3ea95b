"""The commands a message tells the user to run next, written out with the user's own options: what they typed,
as they typed it (a size as given, a card's name), never a default they did not give nor a path they did not type."""

from __future__ import annotations

import shlex
from typing import Any, List

from autofit.core import ESTIMATE, FIELDS, SearchOptions, algorithm, door_fields

# What an estimate is asked with: options of the search's that would change nothing it predicts are not repeated.
PLACEHOLDER_CARD = "H100"  # where the user named no card: the one the README's estimate names (any name or size does)


def _words(name: str, value: Any) -> List[str]:
    meta = FIELDS[name].metadata
    flag = meta["flags"][-1] if meta["flags"] else "--" + name.replace("_", "-")
    if isinstance(value, bool):  # a switch: written where it differs from its default
        return [flag]
    if isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)
    return [flag, str(value)]


def estimate_command(options: SearchOptions) -> str:
    """``autofit estimate`` with every option of the user's that the estimate takes and that they changed from its
    default (``--device auto`` is the estimate's cuda, so it is left out), and ``--gpu-memory`` named where they gave
    none. The launch after ``--`` is written back where it is a TRL command's file and flags."""
    words = ["autofit", "estimate"]
    for name in door_fields(ESTIMATE):
        value = getattr(options, name)
        if name == "gpu_memory" and value is None:
            value = PLACEHOLDER_CARD
        if value is None or (value == FIELDS[name].default and name != "gpu_memory"):
            continue
        words += _words(name, value)
    command = " ".join(shlex.quote(word) for word in words)
    trl = algorithm(options.algo).trl_command
    if options.launch_args and options.config and trl and "--" not in options.launch_args:
        command += " -- " + " ".join(shlex.quote(w) for w in ("trl", trl, "--config", options.config,
                                                              *options.launch_args))
    return command
