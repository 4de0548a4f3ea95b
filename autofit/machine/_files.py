"""Files a user can trust: written whole or not at all, never through a link someone else put there. The cache too:
a folder that another user owns or every user may write to is refused, and an entry is used only while it is what was
written (a manifest written last, checked on every use), else built again into a new folder that replaces it."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

from autofit.core import InputError, one_line

log = logging.getLogger(__name__)

MANIFEST = ".autofit-manifest.json"  # a cache entry's last file: its key, and each file's size and digest
_HEADER_LIMIT = 100 * 2**20  # a safetensors header longer than this is not one a checkpoint writer wrote


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` through a new temporary file in its folder, then ``os.replace``: a reader sees the old file
    or the new one, never half, and a symlink at ``path`` is replaced, not written through."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is None:  # a write or fsync failing (a full disk, ulimit -f) names no file: name the one
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def cache_dir() -> Path:
    """Where autofit keeps what it can build again (random checkpoints, parameter censuses): ``$AUTOFIT_CACHE``,
    else ``$XDG_CACHE_HOME/autofit``, else ``~/.cache/autofit``. What is in it decides what the probes load, so a
    folder that someone else could fill is refused (``check_private``)."""
    root = os.environ.get("AUTOFIT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "autofit"
    folder = Path(root).expanduser()
    check_private(folder)
    return folder


def check_private(folder: Path) -> None:
    """Refuse, with one line naming it, a cache folder owned by another user (the folder, or a link to it) or
    writable by every user without the sticky bit. A folder not there yet is fine: it is created for its owner."""
    try:
        seen = (os.lstat(folder), os.stat(folder))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InputError(f"the cache folder {one_line(folder)} cannot be read: {exc.strerror or exc}") from None
    for info in seen:
        if info.st_uid != os.geteuid():
            raise InputError(f"the cache folder {one_line(folder)} belongs to another user (uid {info.st_uid}): set "
                             "AUTOFIT_CACHE to a folder of yours")
    mode = seen[1].st_mode
    if not stat.S_ISDIR(mode):
        raise InputError(f"the cache folder {one_line(folder)} is not a folder: set AUTOFIT_CACHE to a folder of yours")
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise InputError(f"the cache folder {one_line(folder)} can be written by every user (mode {oct(mode & 0o777)}):"
                         " chmod o-w it, or set AUTOFIT_CACHE to a folder of yours")


def read_own_file(path: Path, limit: int = 64 << 20) -> str:
    """A file of the cache as autofit wrote it: a regular file, not a link (opened without following one), owned by
    this user and writable by no one else, at most ``limit`` bytes. ``OSError`` (a link: ELOOP) or ``ValueError``
    (saying which) otherwise; ``FileNotFoundError`` where there is none."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("it is not a regular file")
        if info.st_uid != os.geteuid():
            raise ValueError(f"it belongs to another user (uid {info.st_uid})")
        if info.st_mode & 0o022:
            raise ValueError("other users may write it")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"it is larger than {limit} bytes")
    return data.decode("utf-8")


def cache_subfolder(*parts: str) -> Path:
    """``cache_dir() / parts``, each level created where missing (for its owner only) and checked as the root is."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        check_private(folder)
        for part in parts:
            folder = folder / part
            with contextlib.suppress(FileExistsError):
                folder.mkdir(mode=0o700)
            check_private(folder)
    except OSError as exc:  # HOME unwritable or gone, a read-only filesystem: no cache, one line
        raise InputError(f"the cache folder {one_line(folder)} cannot be created ({exc.strerror or one_line(exc)}):"
                         " set AUTOFIT_CACHE to a folder you can write") from None
    return folder


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold ``path`` with ``flock``: created where missing, never opened through a link (one planted there is
    removed) and never truncated."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError:
        if not path.is_symlink():
            raise
        path.unlink()
        fd = os.open(path, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def cache_entry(folder: Path, key: str, build: Callable[[Path], None]) -> Path:
    """``folder``, a cache entry for ``key``: used as it is when its manifest (written last) says it was built for
    ``key`` and every file still has the size and content it was written with (``entry_problem``). Otherwise (never
    built, cut short, truncated, edited, built for another key) ``build`` fills a new folder beside it, under a lock,
    and that folder replaces it whole: nothing is written into a folder that was there before."""
    if entry_problem(folder, key) is None:
        return folder
    tag = hashlib.sha1(folder.name.encode()).hexdigest()[:16]  # short: the entry's own name may be long
    with locked(folder.with_name(f".{tag}.lock")):
        problem = entry_problem(folder, key)
        if problem is None:  # built by another process while this one waited
            return folder
        if os.path.lexists(folder):
            log.warning("the cache entry %s is damaged (%s): building it again", one_line(folder), problem)
        for stale in os.listdir(folder.parent):  # left by a build of this entry that was killed
            if stale.startswith(f".{tag}.") and stale.endswith(".tmp"):
                _remove(folder.parent / stale)
        fresh = Path(tempfile.mkdtemp(prefix=f".{tag}.", suffix=".tmp", dir=folder.parent))
        old = folder.with_name(f".{tag}.{secrets.token_hex(6)}.tmp")
        try:
            build(fresh)
            atomic_write_text(fresh / MANIFEST, json.dumps({"key": key, "files": _fingerprints(fresh)}) + "\n")
            if os.path.lexists(folder):
                os.rename(folder, old)
            os.rename(fresh, folder)
        finally:
            _remove(fresh)
            _remove(old)
    return folder


def entry_problem(folder: Path, key: str) -> Optional[str]:
    """Why ``folder`` is not a sound cache entry for ``key`` (missing, no manifest, another key, a file added,
    missing, resized, changed, or a safetensors file shorter or longer than its header says), or None."""
    if folder.is_symlink():
        return "it is a symbolic link"
    if not folder.is_dir():
        return "missing"
    manifest = folder / MANIFEST
    if manifest.is_symlink() or not manifest.is_file():
        return "it has no manifest: cut short, or written by an earlier autofit"
    try:
        written = json.loads(manifest.read_text())
        if not isinstance(written, dict) or written.get("key") != key:
            return "it was built for another configuration or library version"
        found = _fingerprints(folder)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return one_line(exc)
    files = written.get("files")
    if not isinstance(files, dict):
        return "its manifest lists no files"
    for name in sorted(set(files) | set(found)):
        if name not in found:
            return f"{one_line(name)} is missing"
        if name not in files:
            return f"{one_line(name)} was added after it was written"
        if found[name] != files[name]:
            return f"{one_line(name)} was changed after it was written"
    return None


def _fingerprints(folder: Path) -> Dict[str, Dict[str, object]]:
    """Each plain file of ``folder`` (the manifest and subfolders aside): its size and digest."""
    found: Dict[str, Dict[str, object]] = {}
    for entry in os.scandir(folder):
        if entry.name == MANIFEST or entry.is_dir(follow_symlinks=False):
            continue
        if not entry.is_file(follow_symlinks=False):
            raise ValueError(f"{entry.name} is not a plain file")
        found[entry.name] = {"size": entry.stat(follow_symlinks=False).st_size, "sha256": _digest(Path(entry.path))}
    return found


def _digest(path: Path) -> str:
    """sha256 of the file; of a safetensors file, of its header alone (its tensors may be many GB, or a hole), once
    the file's length is found to be what the header says."""
    with open(path, "rb") as handle:
        if path.suffix != ".safetensors":
            return hashlib.sha256(handle.read()).hexdigest()
        head = handle.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else 0
        header = handle.read(length) if 0 < length <= _HEADER_LIMIT else b""
        if not header or len(header) != length:
            raise ValueError(f"{path.name} has no complete safetensors header")
        ends = [int(entry["data_offsets"][1]) for name, entry in json.loads(header).items() if name != "__metadata__"]
        size, expected = os.fstat(handle.fileno()).st_size, 8 + length + max(ends, default=0)
        if size != expected:
            raise ValueError(f"{path.name} has {size:,} bytes where its header says {expected:,}")
        return hashlib.sha256(head + header).hexdigest()


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)  # links inside are removed, not followed
