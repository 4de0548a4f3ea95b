"""The search's side of the workers (issue 49, item 2): a ``Runner`` that hands each probe out through the queue
instead of starting a process, and waits for a worker's result.

A worker that goes silent (its heartbeat has not moved for ``lost_after_s`` by this process's clock, so the nodes'
clocks need not agree) has lost its probe: the trial is failed with the reason, and the same probe is handed out
again, as Optuna's ``RetryFailedTrialCallback`` does with a heartbeat-stale trial (Optuna's own heartbeat is kept by
its database storage only; this one works on the journal file and Redis too). A worker's late result for a trial
given up on is refused by the storage, so a probe is counted once.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from optuna.trial import TrialState

from autofit.core import INFRASTRUCTURE, Candidate, Outcome, ProbeResult, clip, masked, one_line
from autofit.probe import FactoryPayload, ProbeCancelled
from autofit.workers._queue import BEAT, CANCEL, REASON, WORKER, ForeignTrial, ProbeQueue
from autofit.workers._signing import queue_key
from autofit.workers._storage import open_storage

log = logging.getLogger(__name__)

POLL_S = 0.5
WAITING_NOTE_S = 30.0  # a probe no worker has taken for this long is said once
HAND_OUTS = 3  # a probe whose workers are lost this many times is a crash of the infrastructure, not an answer
LOST = "lost"  # the reason's first word for a trial given up on: its worker went silent


@dataclass(frozen=True)
class ProbeJob:
    """What a worker needs to run the probe as this search's own runner would."""

    factory: FactoryPayload
    candidate: Candidate
    plan: Dict[str, Any]
    budget_bytes: Optional[int]
    timeout_s: float
    build_timeout_s: Optional[float] = None
    rung_steps: Tuple[Tuple[str, str], ...] = ()
    search: str = ""  # the search's queue study, for the worker's log


class HandOutRunner:
    """A ``Runner`` whose probes run on ``autofit worker`` processes: ``run`` puts the probe in the queue and waits
    for its result, handing it out again where its worker is lost. ``stop`` (set by the slot runner) cancels it."""

    def __init__(self, location: str, out_dir: Path, factory: FactoryPayload, budget_bytes: Optional[int], *,
                 timeout_s: float, lost_after_s: float, build_timeout_s: Optional[float] = None,
                 rung_steps: Sequence[Tuple[str, str]] = ()):
        self.location = masked(location)  # as messages and files name it
        self.queue = ProbeQueue(open_storage(location), key=queue_key(create=True), where=self.location)
        self.study_name = ProbeQueue.study_name(out_dir)
        self.study = self.queue.open_study(self.study_name)
        self.factory = factory
        self.budget_bytes = budget_bytes
        self.timeout_s = timeout_s
        self.build_timeout_s = build_timeout_s
        self.rung_steps = tuple(rung_steps)
        self.lost_after_s = lost_after_s
        self.stop = threading.Event()
        self.handed_out = 0  # probes put in the queue, again-handed ones included
        self.lost = 0  # trials given up on: their worker went silent

    def on_devices(self, devices: Sequence[str], threads: Optional[int] = None) -> HandOutRunner:
        return self  # a slot here is a worker's turn: the worker gives the probe its own devices

    def run(self, candidate: Candidate, steps: int, *, min_steps: int = 0, time_cap_s: Optional[float] = None,
            full_accumulation: bool = False) -> ProbeResult:
        plan = dict(steps=steps, min_steps=min_steps, time_cap_s=time_cap_s, full_accumulation=full_accumulation)
        job = ProbeJob(self.factory, candidate, plan, self.budget_bytes, self.timeout_s, self.build_timeout_s,
                       self.rung_steps, self.study_name)
        reasons = []
        for _ in range(HAND_OUTS):
            self.handed_out += 1
            trial_id = self.queue.put(self.study, job, candidate.ranks)
            result, reason = self._wait(trial_id, candidate)
            if result is not None:
                return result
            reasons.append(reason)
        return ProbeResult(outcome=Outcome.CRASH, fault=INFRASTRUCTURE, cause="workers lost",
                           error=f"handed out {HAND_OUTS} times, and each time: {reasons[-1]}")

    def close(self) -> None:
        """The search has ended, or was interrupted: what is still waiting is failed, a running probe's worker is
        told to stop, and the workers may leave. A queue that cannot be written now is said, not raised: the
        search's own answer (or its interruption) is what the user is told."""
        self.stop.set()
        interrupted: Optional[KeyboardInterrupt] = None
        for _ in range(3):  # a second Ctrl-C while it closes: closed all the same, then the interruption goes on
            try:
                self.queue.close(self.study)
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
            except Exception as exc:  # noqa: BLE001 - see above
                log.warning("the queue %s was not closed (%s): its workers leave after --idle-exit", self.location,
                            one_line(exc))
                break
        if interrupted is not None:
            raise interrupted

    def _wait(self, trial_id: int, candidate: Candidate) -> Tuple[Optional[ProbeResult], str]:
        """The trial's result, or (None, why) where its worker was lost."""
        put_at = time.monotonic()
        said_waiting, last_beat, moved_at = False, None, None
        while True:
            if self.stop.is_set():
                self.queue.cancel(trial_id)
                raise ProbeCancelled("stopped: the search no longer needs this probe")
            trial = self.queue.trial(trial_id)
            now = time.monotonic()
            if trial.state == TrialState.COMPLETE:
                try:
                    return ProbeResult.from_dict(self.queue.result(self.study_name, trial)), ""
                except (ForeignTrial, ValueError) as exc:  # a forged measurement, or one not readable: measured again
                    log.warning("probe %s: %s; handing it out again", candidate.describe(), exc)
                    return None, str(exc)
            if trial.state == TrialState.FAIL:  # a worker that could not run it said why
                reason = clip(one_line(trial.user_attrs.get(REASON, "failed")), 300)
                if reason.startswith(LOST) or trial.user_attrs.get(CANCEL):
                    return None, reason
                return ProbeResult(outcome=Outcome.CRASH, fault=INFRASTRUCTURE, cause="worker",
                                   error=f"the worker could not run the probe: {reason}"), ""
            if trial.state == TrialState.WAITING:
                if not said_waiting and now - put_at > WAITING_NOTE_S:
                    log.info("probe %s waits for a worker: start `autofit worker --study %s` where %d GPU(s) are "
                             "free for it", candidate.describe(), self.location, candidate.ranks)
                    said_waiting = True
            elif trial.state == TrialState.RUNNING:
                beat = trial.user_attrs.get(BEAT)
                if moved_at is None or beat != last_beat:
                    last_beat, moved_at = beat, now
                elif now - moved_at > self.lost_after_s:
                    worker = clip(one_line(trial.user_attrs.get(WORKER, "its worker")), 120)
                    reason = f"{LOST}: {worker} gave no heartbeat for {self.lost_after_s:g} s"
                    self.queue.fail(trial_id, reason)
                    self.lost += 1
                    log.warning("probe %s: %s; handing it out again", candidate.describe(), reason)
                    return None, reason
            time.sleep(POLL_S)
