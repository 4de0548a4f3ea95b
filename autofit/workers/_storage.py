"""Where the queue lives (``--worker-queue``, a worker's ``--study``), opened as Optuna's storage: a folder
(``queue.journal`` in it, Optuna's journal file with its NFS-safe lock, for a shared filesystem), ``redis://``
(Optuna's Redis journal), or a database URL (``postgresql://``, ``mysql://``, ``sqlite:///``: Optuna's RDB storage).

A folder is the user's own: one that others may write to (or whose journal is a link, or not a regular file of
theirs) is refused, as ``--out`` is. A server's password need not be on the command line, which every user of the
node can read: ``$AUTOFIT_QUEUE_PASSWORD``, or the file ``$AUTOFIT_QUEUE_PASSWORD_FILE`` (readable by its owner
only), fills a URL that has none (PostgreSQL's own ``PGPASSWORD`` and ``~/.pgpass`` work too). No message shows it.
"""

from __future__ import annotations

import logging
import os
import stat
import time
import warnings
from pathlib import Path
from typing import Union
from urllib.parse import quote

from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from autofit.core import InputError, masked, one_line, url_parts
from autofit.machine import check_folder_private, read_own_file

log = logging.getLogger(__name__)

QUEUE_FILE = "queue.journal"
DATABASES = ("postgresql", "mysql", "sqlite")
SERVERS = ("redis", "rediss", "unix")
ACCEPTED = "a folder (a shared filesystem), redis://HOST:PORT, or postgresql://USER@HOST/DB is accepted"
PASSWORD_ENV, PASSWORD_FILE_ENV = "AUTOFIT_QUEUE_PASSWORD", "AUTOFIT_QUEUE_PASSWORD_FILE"


class QueueUnreadable(InputError):
    """The queue's storage cannot be read: a journal with a line that is not Optuna's record, a server gone."""


def scheme_of(location: str) -> str:
    return location.split("://", 1)[0].split("+", 1)[0].lower() if "://" in location else ""


def open_storage(location: Union[str, Path]) -> BaseStorage:
    """The storage at ``location``; one line (its password masked) where it cannot be used."""
    text = str(location)
    if not text.strip():
        raise InputError(f"the queue {text!r} names nothing: {ACCEPTED}")
    if "://" in text:
        text = text.strip()  # a URL pasted with a space around it
    scheme = scheme_of(text)
    if not scheme:
        return _folder(Path(text))
    url = with_password(text, scheme)
    try:
        if scheme in SERVERS:
            from optuna.storages.journal import JournalRedisBackend

            with warnings.catch_warnings():  # "experimental" since Optuna 3.1, and what Optuna's docs recommend
                warnings.simplefilter("ignore", ExperimentalWarning)
                backend = JournalRedisBackend(url)
            backend._redis.ping()  # a server that is not there is one line now, not a hang at the first probe
            return JournalStorage(backend)
        if scheme in DATABASES:
            return _database(url, scheme)
    except ImportError as exc:
        raise InputError(f"the queue {masked(text)} needs a package that is not installed ({one_line(exc)}): "
                         "pip install 'autofit[workers]'") from None
    except Exception as exc:  # noqa: BLE001 - a server refusing, a bad URL: each driver raises its own
        said = masked(one_line(exc), secrets_of=url)[:200]
        raise InputError(f"the queue {masked(text)} cannot be reached ({type(exc).__name__}: {said})") from None
    raise InputError(f"the queue {masked(text)} has a scheme autofit does not read: {ACCEPTED}")


def with_password(url: str, scheme: str) -> str:
    """``url`` with the password of ``$AUTOFIT_QUEUE_PASSWORD`` (or its file) where it names none."""
    password = os.environ.get(PASSWORD_ENV)
    named = os.environ.get(PASSWORD_FILE_ENV)
    if password is None and named:
        try:
            password = read_own_file(Path(named).expanduser(), limit=4096).strip()
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(exc)
            raise InputError(f"{PASSWORD_FILE_ENV} {named} cannot be used: {reason}") from None
        if os.stat(Path(named).expanduser()).st_mode & 0o044:
            raise InputError(f"{PASSWORD_FILE_ENV} {named} can be read by others: chmod 600 it")
    if not password or scheme == "sqlite":
        return url
    try:
        password.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{PASSWORD_ENV if os.environ.get(PASSWORD_ENV) is not None else PASSWORD_FILE_ENV} holds "
                         "bytes that are not UTF-8 text: a password a URL can carry is accepted") from None
    secret = quote(password, safe="")
    head, authority, tail = url_parts(url)
    if scheme == "unix":  # a socket's URL has no host part: Redis reads the password as a query parameter
        return url if "password=" in tail else f"{url}{'&' if '?' in tail else '?'}password={secret}"
    userinfo, at, host = authority.rpartition("@")
    if ":" in userinfo:
        return url  # the URL names its own password
    return f"{head}://{userinfo}:{secret}@{host if at else authority}{tail}"


def _folder(folder: Path) -> BaseStorage:
    label = f"the queue folder {one_line(folder)}"
    if folder.exists() and not folder.is_dir():
        raise InputError(f"the queue {one_line(folder)} is a file: {ACCEPTED}")
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{label} cannot be written: {exc.strerror or exc}") from None
    check_folder_private(folder, label)  # others who write here could plant trials, or a link for the journal
    journal = folder / QUEUE_FILE
    try:
        _check_journal(journal)
        return JournalStorage(JournalFileBackend(str(journal)))
    except OSError as exc:
        raise InputError(f"{label} cannot be written: {exc.strerror or exc}") from None
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - Optuna replaying a journal that is not one
        raise QueueUnreadable(f"the queue journal {one_line(journal)} cannot be read ({type(exc).__name__}: "
                         f"{one_line(exc)[:160]}): move it away, and the searches that use it start a new one"
                         ) from None


def _check_journal(journal: Path) -> None:
    """Optuna opens the journal by its name, following links: one that is a link, or not a regular file of this
    user's, is refused before Optuna writes a record through it. The folder is the user's own (checked), so no one
    else can put a link there after this check."""
    lock = journal.with_name(journal.name + ".lock")  # Optuna's lock: a link to the journal while a writer holds it
    if lock.is_symlink() and not lock.exists():  # one left pointing nowhere: Optuna's wait for it spins forever
        lock.unlink(missing_ok=True)
        log.warning("the queue's lock %s pointed nowhere (a journal moved away while it was held): removed",
                    one_line(lock))
    try:
        info = os.lstat(journal)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise InputError(f"the queue journal {one_line(journal)} is a symbolic link; autofit does not write through "
                         "links")
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        raise InputError(f"the queue journal {one_line(journal)} is not a regular file of yours")


def _database(url: str, scheme: str, attempts: int = 3) -> RDBStorage:
    """Optuna's RDB storage at ``url``. The search and its workers start together, and on an empty database two of
    them creating Optuna's tables at once collide (a duplicate type or table): the one that lost finds them made."""
    for attempt in range(attempts):
        try:
            return RDBStorage(url, engine_kwargs={"pool_pre_ping": True} if scheme != "sqlite" else None)
        except ImportError:
            raise
        except Exception:  # noqa: BLE001 - the driver's own types; the last attempt's error is the message
            if attempt == attempts - 1:
                raise
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")
