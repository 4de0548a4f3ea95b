"""The hand-out queue: an Optuna study in the storage the search and its workers share, one trial per probe handed
out. The search adds a waiting trial carrying the probe (``put``); a worker takes it by moving it from WAITING to
RUNNING, which the storage grants to one taker only (Optuna's own pop of an enqueued trial, atomic on the journal
file, the Redis journal and a database); while it probes it counts its heartbeat up, and it completes the trial with
the result. The search reads the trial until it is done.

Where it lives (``--worker-queue``, a worker's ``--study``): a folder (``queue.journal`` in it, Optuna's journal file
with its NFS-safe lock, for a shared filesystem), ``redis://`` (Optuna's Redis journal), or a database URL
(``postgresql://``, ``mysql://``, ``sqlite:///``: Optuna's RDB storage). One study per search, named by the host and
output folder of the search; a worker serves every study in the storage that is open.
"""

from __future__ import annotations

import base64
import logging
import pickle
import socket
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from autofit.core import InputError, one_line

log = logging.getLogger(__name__)

QUEUE_FILE = "queue.journal"
PREFIX = "autofit-probes:"  # the studies this module keeps, and no other study of a shared storage
JOB, RANKS, BEAT, RESULT, CANCEL, REASON, WORKER = "job", "ranks", "beat", "result", "cancel", "reason", "worker"
CLOSED = "closed"  # a queue study's user attribute: its search has ended
DATABASES = ("postgresql", "mysql", "sqlite")
ACCEPTED = "a folder (a shared filesystem), redis://HOST:PORT, or postgresql://USER:PASSWORD@HOST/DB is accepted"


def open_storage(location: Union[str, Path]) -> BaseStorage:
    """The storage at ``location`` (a folder, ``redis://``, or a database URL); one line where it cannot be used."""
    text = str(location)
    scheme = text.split("://", 1)[0].split("+", 1)[0].lower() if "://" in text else ""
    try:
        if scheme in ("redis", "rediss", "unix"):
            from optuna.storages.journal import JournalRedisBackend

            with warnings.catch_warnings():  # "experimental" since Optuna 3.1, and what Optuna's docs recommend
                warnings.simplefilter("ignore", ExperimentalWarning)
                backend = JournalRedisBackend(text)
            backend._redis.ping()  # a server that is not there is one line now, not a hang at the first probe
            return JournalStorage(backend)
        if scheme in DATABASES:
            return _database(text, scheme)
    except ImportError as exc:
        raise InputError(f"the queue {_shown(text)} needs a package that is not installed ({one_line(exc)}): "
                         "pip install 'autofit[workers]'") from None
    except Exception as exc:  # noqa: BLE001 - a server refusing, a bad URL: each driver raises its own
        raise InputError(f"the queue {_shown(text)} cannot be reached ({type(exc).__name__}: "
                         f"{one_line(exc)[:200]})") from None
    if scheme:
        raise InputError(f"the queue {_shown(text)} has a scheme autofit does not read: {ACCEPTED}")
    folder = Path(text)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"the queue {text} is a file: {ACCEPTED}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(folder / QUEUE_FILE)))
    except OSError as exc:
        raise InputError(f"the queue folder {text} cannot be written: {exc.strerror or exc}") from None


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


def _shown(url: str) -> str:
    """A URL as a message may show it: its password left out."""
    head, sep, tail = url.partition("://")
    if sep and "@" in tail:
        credentials, _, host = tail.rpartition("@")
        return f"{head}://{credentials.split(':', 1)[0]}:***@{host}" if ":" in credentials else url
    return url


@dataclass
class Taken:
    """A probe a worker took: its trial, and the job the search put in it."""

    study: str
    trial_id: int
    number: int
    job: Any


class ProbeQueue:
    """One storage's queue studies, as the search and the workers use them."""

    def __init__(self, storage: BaseStorage):
        self.storage = storage

    # -- the search's side --------------------------------------------------------------------------------------
    @staticmethod
    def study_name(out_dir: Path) -> str:
        return f"{PREFIX}{socket.gethostname()}:{Path(out_dir).resolve()}"

    def open_study(self, name: str) -> optuna.Study:
        """The search's queue, open; probes an earlier run of it left waiting or running are failed (that run is
        gone, and the walk asks for them again)."""
        study = optuna.create_study(study_name=name, storage=self.storage, load_if_exists=True)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
            self.fail(trial._trial_id, "the search that handed it out ended")
        study.set_user_attr(CLOSED, False)
        return study

    def put(self, study: optuna.Study, job: Any, ranks: int) -> int:
        """A waiting trial carrying ``job``; its trial id."""
        tag = uuid.uuid4().hex
        study.enqueue_trial({}, user_attrs={JOB: base64.b64encode(pickle.dumps(job)).decode(), RANKS: ranks,
                                            "tag": tag}, skip_if_exists=False)
        for trial in reversed(study.get_trials(deepcopy=False)):  # any state: a worker may have taken it already
            if trial.user_attrs.get("tag") == tag:
                return trial._trial_id
        raise RuntimeError("a probe put in the queue is not there")  # the storage lost a write

    def trial(self, trial_id: int) -> FrozenTrial:
        return self.storage.get_trial(trial_id)

    def cancel(self, trial_id: int) -> None:
        """The search no longer needs this probe: a waiting one is failed, a running one's worker stops it."""
        try:
            self.storage.set_trial_user_attr(trial_id, CANCEL, True)
            if self.trial(trial_id).state == TrialState.WAITING:
                self.fail(trial_id, "cancelled")
        except UpdateFinishedTrialError:
            pass

    def close(self, study: optuna.Study) -> None:
        for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            self.fail(trial._trial_id, "the search ended")
        study.set_user_attr(CLOSED, True)

    # -- the workers' side --------------------------------------------------------------------------------------
    def open_studies(self) -> Tuple[List[str], int]:
        """The names of the queue studies whose search has not ended, and how many have ended."""
        open_names, closed = [], 0
        for summary in self.storage.get_all_studies():
            if summary.study_name.startswith(PREFIX):
                if summary.user_attrs.get(CLOSED):
                    closed += 1
                else:
                    open_names.append(summary.study_name)
        return open_names, closed

    def take(self, names: List[str], devices: int, worker: str) -> Optional[Taken]:
        """The first waiting probe of these studies that ``devices`` devices can run, now this worker's; None where
        there is none."""
        for name in names:
            try:
                study_id = self.storage.get_study_id_from_name(name)
            except KeyError:
                continue
            for trial in self.storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)):
                if int(trial.user_attrs.get(RANKS, 1)) > devices or trial.user_attrs.get(CANCEL):
                    continue
                try:
                    if not self.storage.set_trial_state_values(trial._trial_id, TrialState.RUNNING):
                        continue  # another worker took it first
                except UpdateFinishedTrialError:
                    continue
                self.storage.set_trial_user_attr(trial._trial_id, WORKER, worker)
                job = pickle.loads(base64.b64decode(trial.user_attrs[JOB]))
                return Taken(name, trial._trial_id, trial.number, job)
        return None

    def beat(self, trial_id: int, count: int) -> bool:
        """Count this probe's heartbeat up; False where the search has given up on it or cancelled it."""
        try:
            self.storage.set_trial_user_attr(trial_id, BEAT, count)
        except UpdateFinishedTrialError:
            return False
        return not self.trial(trial_id).user_attrs.get(CANCEL)

    def finish(self, trial_id: int, result: Dict[str, Any], value: float) -> bool:
        """The probe's result; False where the search has handed it out again meanwhile (this one is dropped)."""
        try:
            self.storage.set_trial_user_attr(trial_id, RESULT, result)
            self.storage.set_trial_state_values(trial_id, TrialState.COMPLETE, values=[value])
        except UpdateFinishedTrialError:
            return False
        return True

    def fail(self, trial_id: int, reason: str) -> None:
        try:
            self.storage.set_trial_user_attr(trial_id, REASON, reason)
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:
            pass
