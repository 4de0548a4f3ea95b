"""Files a user can trust: written whole or not at all, never through a link someone else put there, and values
that reach a comment or a log line kept to one line."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def one_line(text: object) -> str:
    """``text`` with control characters (newlines among them) escaped: it cannot start a line of its own."""
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode(), str(text))


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` through a new temporary file in its folder, then ``os.replace``: a reader sees the old file
    or the new one, never half, and a symlink at ``path`` is replaced, not written through."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def cache_dir() -> Path:
    """Where autofit keeps what it can build again (random checkpoints, parameter censuses): ``$AUTOFIT_CACHE``,
    else ``$XDG_CACHE_HOME/autofit``, else ``~/.cache/autofit``."""
    root = os.environ.get("AUTOFIT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "autofit"
    return Path(root).expanduser()
