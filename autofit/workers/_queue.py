"""The hand-out queue: an Optuna study in the storage the search and its workers share (``_storage``), one trial
per probe handed out. The search adds a waiting trial carrying the probe, signed (``put``; ``_signing``); a worker
takes it by moving it from WAITING to RUNNING, which the storage grants to one taker only (Optuna's own pop of an
enqueued trial, atomic on the journal file, the Redis journal and a database), checks its signature before it
decodes it, counts its heartbeat up while it probes, and completes the trial with the result, signed. The search
reads the trial until it is done, and takes a result only with the worker's signature.

One study per search, named by the host and output folder of the search; a worker serves every study in the
storage that is open.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import pickle
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from autofit.core import InputError, clip, masked, one_line
from autofit.workers._signing import job_signed, queue_key, result_signed, sign_job, sign_result
from autofit.workers._storage import QueueUnreadable

log = logging.getLogger(__name__)

PREFIX = "autofit-probes:"  # the studies this module keeps, and no other study of a shared storage
JOB, RANKS, BEAT, RESULT, CANCEL, REASON, WORKER = "job", "ranks", "beat", "result", "cancel", "reason", "worker"
TAG, SIGNATURE, RESULT_SIGNATURE = "tag", "signature", "result_signature"
CLOSED = "closed"  # a queue study's user attribute: its search has ended
MAX_JOB_CHARS = 16 << 20  # a job is a candidate, a factory's reference and limits: kilobytes; more is not a job
MAX_RANKS = 1024  # the devices one probe may ask of a worker
T = TypeVar("T")


class ForeignTrial(Exception):
    """A trial in a queue study that is not a job this user's search made (unsigned, wrongly signed, or with a field
    that is not what the search writes): failed with this reason, never run."""


def guarded(method: Callable[..., T]) -> Callable[..., T]:
    """A storage's failure inside ``method`` (Optuna replaying a damaged journal raises whatever its parser met:
    ``JSONDecodeError``, ``KeyError``, ``AssertionError``; a server gone, its driver's error) is one line naming
    the queue; what the queue itself says (a finished trial, a foreign one) passes as it is."""

    @functools.wraps(method)
    def wrapper(self: ProbeQueue, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except (UpdateFinishedTrialError, ForeignTrial, InputError):  # the key's own refusal names the key
            raise
        except Exception as exc:  # noqa: BLE001 - see above
            raise QueueUnreadable(f"the queue {self.where} cannot be read ({type(exc).__name__}: "
                                  f"{clip(masked(one_line(exc)), 160)}): a journal with a damaged line can be moved "
                                  "away, and the searches that use it start a new one") from None
    return wrapper


@dataclass
class Taken:
    """A probe a worker took: its trial, and the job the search put in it."""

    study: str
    trial_id: int
    number: int
    job: Any
    tag: str = ""


class ProbeQueue:
    """One storage's queue studies, as the search and the workers use them. ``key``: this user's queue key
    (``_signing``), which signs what the search puts and what a worker gives back; ``where``: the queue as messages
    name it (its password masked)."""

    def __init__(self, storage: BaseStorage, key: Optional[bytes] = None, where: str = "queue"):
        self.storage = storage
        self._key = key
        self.where = where

    @property
    def key(self) -> bytes:
        """The key, read where first needed (a reader of the queue's states needs none)."""
        if self._key is None:
            self._key = queue_key(create=False)
        return self._key

    # -- the search's side --------------------------------------------------------------------------------------
    @staticmethod
    def study_name(out_dir: Path) -> str:
        return f"{PREFIX}{socket.gethostname()}:{Path(out_dir).resolve()}"

    @guarded
    def open_study(self, name: str) -> optuna.Study:
        """The search's queue, open; probes an earlier run of it left waiting or running are failed (that run is
        gone, and the walk asks for them again)."""
        previous = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # its "A new study created" line says nothing here
        try:
            study = optuna.create_study(study_name=name, storage=self.storage, load_if_exists=True)
        finally:
            optuna.logging.set_verbosity(previous)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
            self.fail(trial._trial_id, "the search that handed it out ended")
        study.set_user_attr(CLOSED, False)
        return study

    @guarded
    def put(self, study: optuna.Study, job: Any, ranks: int) -> int:
        """A waiting trial carrying ``job``, signed; its trial id."""
        tag, payload = uuid.uuid4().hex, pickle.dumps(job)
        study.enqueue_trial({}, user_attrs={JOB: base64.b64encode(payload).decode(), RANKS: ranks, TAG: tag,
                                            SIGNATURE: sign_job(self.key, study.study_name, tag, payload)},
                            skip_if_exists=False)
        for trial in reversed(study.get_trials(deepcopy=False)):  # any state: a worker may have taken it already
            if trial.user_attrs.get(TAG) == tag:
                return trial._trial_id
        raise RuntimeError("a probe put in the queue is not there")  # the storage lost a write

    @guarded
    def trial(self, trial_id: int) -> FrozenTrial:
        return self.storage.get_trial(trial_id)

    def result(self, study: str, trial: FrozenTrial) -> Dict[str, Any]:
        """A completed trial's result, as its worker signed it; ``ForeignTrial`` where it is not."""
        result, tag = trial.user_attrs.get(RESULT), trial.user_attrs.get(TAG)
        if not isinstance(tag, str) or not isinstance(result, dict) or \
                not result_signed(self.key, study, tag, result, trial.user_attrs.get(RESULT_SIGNATURE)):
            raise ForeignTrial(f"trial {trial.number} of {study} holds a result no worker with this user's queue key "
                               "signed")
        return result

    @guarded
    def cancel(self, trial_id: int) -> None:
        """The search no longer needs this probe: a waiting one is failed, a running one's worker stops it."""
        try:
            self.storage.set_trial_user_attr(trial_id, CANCEL, True)
            if self.trial(trial_id).state == TrialState.WAITING:
                self.fail(trial_id, "cancelled")
        except UpdateFinishedTrialError:
            pass

    @guarded
    def close(self, study: optuna.Study) -> None:
        """The search has ended: its waiting probes are failed, a running one's worker is told to stop, and the
        workers may leave."""
        for trial in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
            if trial.state == TrialState.WAITING:
                self.fail(trial._trial_id, "the search ended")
            else:
                self.cancel(trial._trial_id)
        study.set_user_attr(CLOSED, True)

    # -- the workers' side --------------------------------------------------------------------------------------
    @guarded
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

    @guarded
    def take(self, names: List[str], devices: int, worker: str) -> Optional[Taken]:
        """The first waiting probe of these studies that ``devices`` devices can run, now this worker's; None where
        there is none. A trial that is not a job of this user's search is failed, saying why, and never decoded."""
        if names:
            self.key  # noqa: B018 - read now: a worker without the key refuses itself, not the trials it would claim
        for name in names:
            try:
                study_id = self.storage.get_study_id_from_name(name)
            except KeyError:
                continue
            for trial in self.storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)):
                if trial.user_attrs.get(CANCEL):
                    continue
                try:
                    ranks, problem = _ranks(trial.user_attrs.get(RANKS, 1)), None
                except ForeignTrial as exc:
                    ranks, problem = 0, str(exc)
                if ranks > devices:
                    continue
                try:
                    if not self.storage.set_trial_state_values(trial._trial_id, TrialState.RUNNING):
                        continue  # another worker took it first
                except UpdateFinishedTrialError:
                    continue
                try:
                    if problem:
                        raise ForeignTrial(problem)
                    job = self._job(name, trial)
                except ForeignTrial as exc:
                    self._refuse(name, trial, str(exc))
                    continue
                except InputError:
                    raise
                except Exception as exc:  # noqa: BLE001 - whatever else a store's writer made: refused, never fatal
                    self._refuse(name, trial, f"its fields cannot be read ({type(exc).__name__}: "
                                              f"{clip(one_line(exc), 120)})")
                    continue
                self.storage.set_trial_user_attr(trial._trial_id, WORKER, worker)
                return Taken(name, trial._trial_id, trial.number, job, trial.user_attrs[TAG])
        return None

    def _job(self, study: str, trial: FrozenTrial) -> Any:
        """The job a trial carries, decoded only once its signature is this user's search's."""
        text, tag = trial.user_attrs.get(JOB), trial.user_attrs.get(TAG)
        if not isinstance(text, str) or not isinstance(tag, str) or not tag.isascii():
            raise ForeignTrial("it carries no job of a search's (a job and its tag)")
        if len(text) > MAX_JOB_CHARS:
            raise ForeignTrial(f"its job is {len(text):,} characters long: a search's is at most {MAX_JOB_CHARS:,}")
        try:
            payload = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ForeignTrial("its job is not base64") from None
        if not job_signed(self.key, study, tag, payload, trial.user_attrs.get(SIGNATURE)):
            raise ForeignTrial("its job is not signed with this user's queue key (a search's own, or made with "
                               "another key): not run")
        try:
            return pickle.loads(payload)
        except Exception as exc:  # noqa: BLE001 - signed, yet not readable here (another autofit's job)
            raise ForeignTrial(f"its job cannot be read here ({type(exc).__name__}: {clip(one_line(exc), 120)}): "
                               "is the worker's autofit the search's?") from None

    def _refuse(self, study: str, trial: FrozenTrial, problem: str) -> None:
        log.warning("autofit worker: trial %d of %s in the queue %s is not run: %s", trial.number, one_line(study),
                    self.where, problem)
        self.fail(trial._trial_id, f"refused by a worker: {problem}")

    @guarded
    def beat(self, trial_id: int, count: int) -> bool:
        """Count this probe's heartbeat up; False where the search has given up on it or cancelled it."""
        try:
            self.storage.set_trial_user_attr(trial_id, BEAT, count)
        except UpdateFinishedTrialError:
            return False
        return not self.trial(trial_id).user_attrs.get(CANCEL)

    @guarded
    def finish(self, taken: Taken, result: Dict[str, Any], value: float) -> bool:
        """The probe's result, signed; False where the search has handed it out again meanwhile (it is dropped)."""
        try:
            self.storage.set_trial_user_attr(taken.trial_id, RESULT_SIGNATURE,
                                             sign_result(self.key, taken.study, taken.tag, result))
            self.storage.set_trial_user_attr(taken.trial_id, RESULT, result)
            self.storage.set_trial_state_values(taken.trial_id, TrialState.COMPLETE, values=[value])
        except UpdateFinishedTrialError:
            return False
        return True

    @guarded
    def fail(self, trial_id: int, reason: str) -> None:
        try:
            self.storage.set_trial_user_attr(trial_id, REASON, reason)
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:
            pass


def _ranks(value: Any) -> int:
    """A trial's device count, as a search writes it: a whole number from 1 to ``MAX_RANKS``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RANKS:
        raise ForeignTrial(f"its field '{RANKS}' is {clip(one_line(repr(value)), 60)}, not a number of devices "
                           f"(1 to {MAX_RANKS})")
    return value
