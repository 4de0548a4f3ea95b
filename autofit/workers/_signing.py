"""What a worker trusts: a job the search made, and nothing else. The queue is a store others may reach (a shared
filesystem, Redis, a database), and a job is a pickle, which runs code when it is read; so every job carries an
HMAC-SHA256 of its bytes under a key only this user holds, bound to its queue study and trial tag, and a worker
checks it before it decodes anything (as Celery's ``auth`` serializer signs its messages, and where Optuna and Dask
leave the store's trust to its owner). Results come back signed the same way, so a store's writer cannot forge a
measurement either.

The key: ``$AUTOFIT_QUEUE_KEY`` (the key itself, for nodes that do not share the search's home), else the file
``$AUTOFIT_QUEUE_KEY_FILE``, else ``$XDG_CONFIG_HOME/autofit/queue.key`` (``~/.config/autofit/queue.key``), which the
search creates where missing: 32 random bytes, readable by this user only, in a folder of this user's only. A
worker reads the same key; a key file others may read (or write, or that is a link) is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any, Dict

from autofit.core import InputError, one_line

KEY_ENV, KEY_FILE_ENV = "AUTOFIT_QUEUE_KEY", "AUTOFIT_QUEUE_KEY_FILE"
MIN_KEY_CHARS = 32
JOB_CONTEXT, RESULT_CONTEXT = b"autofit-job-v1", b"autofit-result-v1"


def key_path() -> Path:
    named = os.environ.get(KEY_FILE_ENV)
    if named:
        return Path(named).expanduser()
    return Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config").expanduser() / "autofit" / "queue.key"


def queue_key(create: bool) -> bytes:
    """This user's queue key; ``create``: the search's side, which makes the key file where there is none (a
    worker's side never does: a worker without the search's key could only refuse its jobs)."""
    given = os.environ.get(KEY_ENV)
    if given is not None:
        if len(given.strip()) < MIN_KEY_CHARS:
            raise InputError(f"{KEY_ENV} holds {len(given.strip())} characters: at least {MIN_KEY_CHARS} are "
                             "accepted (e.g. the content of ~/.config/autofit/queue.key)")
        return os.fsencode(given.strip())  # bytes as the environment holds them, UTF-8 or not
    path = key_path()
    if create:
        _create(path)
    try:
        return _read(path)
    except FileNotFoundError:
        raise InputError(f"no queue key at {path}: a search with --workers writes it; on a node that does not share "
                         f"that home, set {KEY_ENV} to its content (or {KEY_FILE_ENV} to a copy only you can read)"
                         ) from None


def _create(path: Path) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return  # there already (or a search beside this one made it first): read and checked as any
    except OSError as exc:
        raise InputError(f"the queue key {path} cannot be created ({exc.strerror or one_line(exc)}): set "
                         f"{KEY_FILE_ENV} to a file you can write, or {KEY_ENV} to a key") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")


def _read(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:  # a link: ELOOP
        raise InputError(f"the queue key {path} cannot be read ({exc.strerror or one_line(exc)}): it must be a "
                         "regular file of yours, not a link") from None
    try:
        info = os.fstat(fd)
        problem = ("it is not a regular file" if not stat.S_ISREG(info.st_mode) else
                   f"it belongs to another user (uid {info.st_uid})" if info.st_uid != os.geteuid() else
                   f"others may read or write it (mode {oct(info.st_mode & 0o777)}): chmod 600 it"
                   if info.st_mode & 0o077 else None)
        if problem:
            raise InputError(f"the queue key {path} is refused: {problem}")
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(data) < MIN_KEY_CHARS:
        raise InputError(f"the queue key {path} holds {len(data)} characters: at least {MIN_KEY_CHARS} are accepted "
                         "(remove it, and the next search with --workers writes a new one)")
    return data


def _mac(key: bytes, context: bytes, study: str, tag: str, payload: bytes) -> str:
    # surrogatepass: a name a store's writer made (a lone surrogate) is bytes to sign, never an error
    message = b"\0".join((context, study.encode("utf-8", "surrogatepass"), tag.encode("utf-8", "surrogatepass"),
                           payload))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _same(expected: str, signature: Any) -> bool:
    """``signature`` is ``expected``, compared in constant time; any other type or text is not."""
    return isinstance(signature, str) and signature.isascii() and hmac.compare_digest(expected, signature)


def sign_job(key: bytes, study: str, tag: str, payload: bytes) -> str:
    return _mac(key, JOB_CONTEXT, study, tag, payload)


def job_signed(key: bytes, study: str, tag: str, payload: bytes, signature: Any) -> bool:
    return _same(sign_job(key, study, tag, payload), signature)


def _result_bytes(result: Dict[str, Any]) -> bytes:
    return json.dumps(result, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()


def sign_result(key: bytes, study: str, tag: str, result: Dict[str, Any]) -> str:
    return _mac(key, RESULT_CONTEXT, study, tag, _result_bytes(result))


def result_signed(key: bytes, study: str, tag: str, result: Any, signature: Any) -> bool:
    try:
        return isinstance(result, dict) and _same(sign_result(key, study, tag, result), signature)
    except (TypeError, ValueError):  # a result JSON cannot write: not a worker's
        return False
