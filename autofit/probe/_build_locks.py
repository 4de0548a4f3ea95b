"""Locks a killed build of a torch extension leaves behind. torch's ``cpp_extension.load`` (DeepSpeed builds its ops
with it on first use, its shm_comm on the CPU) takes the build folder with a ``lock`` file (``FileBaton``: an
exclusive create, no owner written) and every later build of that op waits for the file to go. A build killed
half-way (a Ctrl-C, a killed probe) never removes it: every later probe of that engine waits until its time limit,
which would read as the candidate's time-out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

STALE_LOCK_CAUSE = "build-lock"


def extensions_root() -> Path:
    """Where torch builds its extensions, as ``torch.utils.cpp_extension._get_build_directory`` reads it:
    ``$TORCH_EXTENSIONS_DIR``, else ``torch_extensions`` in the user's cache (``$XDG_CACHE_HOME``, else ``~/.cache``),
    with a folder per Python and accelerator under it."""
    named = os.environ.get("TORCH_EXTENSIONS_DIR")
    if named:
        return Path(named).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "torch_extensions"


def stale_build_locks(before: float) -> List[Path]:
    """The build locks that were there before ``before`` (a probe's start) and still are: a build that takes longer
    than a probe's whole time limit is not a build a probe can wait for, so the lock is a killed build's."""
    root = extensions_root()
    found = []
    for pattern in ("*/lock", "*/*/lock"):  # <root>/<op>/lock, <root>/py311_cpu/<op>/lock
        for lock in root.glob(pattern):
            try:
                if lock.stat().st_mtime < before:
                    found.append(lock)
            except OSError:  # removed as we looked: a build that ended
                continue
    return sorted(found)
