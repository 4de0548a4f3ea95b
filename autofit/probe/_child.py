"""The probe process's own plumbing: whether it can use CUDA after the process it was forked from, where its output
goes, and the alarm that bounds the factory's build (runs in the probe process)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from typing import Optional

from autofit.probe._classify import BuildTimeout

THREADS_ENV = "AUTOFIT_PROBE_THREADS"  # the CPU threads of a probe that shares the host with others


def inherited_cuda() -> Optional[str]:
    """Why this probe cannot use CUDA because of the process it was forked from; None when it can.

    A process forked after CUDA was initialized cannot initialize it again ("bad fork"). The probe server records
    whether its preload initialized CUDA (``autofit.probe._preload``); torch itself marks a forked child of a process
    that had (``torch.cuda._is_in_bad_fork``). A spawned probe has neither."""
    preload = sys.modules.get("autofit.probe._preload")
    if preload is not None and getattr(preload, "cuda_initialized", False):
        return ("CUDA was initialized in the probe server before this probe was forked "
                f"(after importing {', '.join(getattr(preload, 'PRELOADED', ()))})")
    torch = sys.modules.get("torch")
    in_bad_fork = getattr(getattr(torch, "cuda", None), "_is_in_bad_fork", None)
    if callable(in_bad_fork) and in_bad_fork():
        return "this probe was forked from a process that had initialized CUDA"
    return None


def detach_into_log(log_path: str) -> None:
    """Make this process a quiet child: its output goes to ``log_path``, and Ctrl-C (which reaches the whole
    process group) is left to the parent, which alone decides and kills it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)


@contextlib.contextmanager
def build_deadline(seconds: Optional[float]):
    """Raise ``BuildTimeout`` in the factory if it has not returned within ``seconds`` (a hang in building is the
    factory's, and costs less than the whole probe's time limit)."""
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise BuildTimeout(f"the trainer factory did not return the trainer within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
