"""SIGTERM (a scheduler's ``scancel``, ``kill``, a container stopping) ends a search or a worker as Ctrl-C does:
as an exception, so that what they hold is let go on the way out (the running probe stopped, the lock released, the
queue's waiting probes cancelled, a worker's probe handed back). Python's default for SIGTERM ends the process
without unwinding: a search killed so left its probe waiting in the queue, and a worker started later ran it."""

from __future__ import annotations

import signal
import threading
from typing import Any

EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # 128 + the signal's number, as a shell reports it


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM."""


def _raise(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def terminate_as_interrupt() -> None:
    """From here on, SIGTERM raises ``Terminated`` in the main thread (a no-op elsewhere)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise)


def exit_code(exc: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
