"""The exit codes of ``autofit search`` and ``autofit estimate``, declared once: the number a shell sees, the reason
as a word a script can match, and its meaning. ``--help``'s epilog, docs/cli.md's table and the ``exit`` block both JSON
documents carry (``--json``) are drawn from this table (a test holds docs/cli.md to it)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from autofit.cli._signals import EXIT_INTERRUPTED, EXIT_TERMINATED

EXIT_OK, EXIT_BAD_INPUT, EXIT_NO_FIT, EXIT_PROBES_CANNOT_RUN = 0, 2, 3, 4


@dataclass(frozen=True)
class ExitCode:
    code: int
    reason: str  # one word, stable: what a script matches on
    meaning: str


EXITS: Tuple[ExitCode, ...] = (
    ExitCode(EXIT_OK, "fits", "a configuration that fits was written (best.yaml, best.json)"),
    ExitCode(EXIT_BAD_INPUT, "bad_input", "bad input, or your trainer factory failed (one line names the value, or "
                                          "your code's frames); nothing was probed for it"),
    ExitCode(EXIT_NO_FIT, "nothing_fits", "nothing fits, even at the last rung: a probe ran out of memory or the "
                                          "memory model ruled it out; the message says what to change"),
    ExitCode(EXIT_PROBES_CANNOT_RUN, "probes_cannot_run", "probes cannot run here: the same non-memory error on two "
                                                          "candidates (bad fork, full disk, CUDA driver, missing "
                                                          "package, probe killed by the host); the message names the "
                                                          "cause and the probe log"),
    ExitCode(EXIT_INTERRUPTED, "interrupted", "interrupted (Ctrl-C): run the same command again to resume"),
    ExitCode(EXIT_TERMINATED, "terminated", "terminated (SIGTERM, a scheduler's scancel): run the same command again "
                                            "to resume"),
)
BY_CODE = {entry.code: entry for entry in EXITS}
# autofit estimate's 0: a prediction was printed, whatever it predicts (its "fits" is per level, in the document)
ESTIMATED = ExitCode(EXIT_OK, "estimated", "the memory model's prediction was printed; no probe ran")


def exit_codes_help() -> str:
    """``autofit search --help``'s epilog."""
    return "exit codes:\n" + "\n".join(textwrap.fill(f"{entry.code:<3} {entry.reason}: {entry.meaning}", width=100,
                                                      initial_indent="  ", subsequent_indent="      ")
                                        for entry in EXITS)


def exit_block(code: int, message: Optional[str] = None, command: str = "search") -> Dict[str, Any]:
    """The ``exit`` block of a JSON document: ``code``, ``reason``, ``meaning`` and the ``message`` printed on stderr
    (the error or the hint line; ``null`` where there was none)."""
    entry = ESTIMATED if command == "estimate" and code == EXIT_OK else BY_CODE[code]
    return {"code": entry.code, "reason": entry.reason, "meaning": entry.meaning, "message": message}
