"""``autofit worker``: a process on a machine with GPUs that takes the probes searches hand out through a shared
storage and runs each as the search would (``ProcessRunner``: a fresh process, its own meter and budget), on its
own devices, one at a time; while a probe runs, its heartbeat counts up in the trial, so the search can tell a dead
worker from a slow probe. It serves every open search in the storage, and leaves once the searches it served have
all ended (or after ``idle_exit_s`` without work)."""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from autofit.core import clip, masked, one_line
from autofit.machine import visible_gpu_count
from autofit.probe import ProbeCancelled, ProcessRunner
from autofit.workers._hand_out import ProbeJob
from autofit.workers._queue import ProbeQueue, QueueUnreadable, Taken
from autofit.workers._storage import open_storage

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often an idle worker looks for a probe
BEAT_S = 5.0  # how often a probing worker's heartbeat counts up


def process_runner(job: Any, folder: Path, devices: Optional[Sequence[str]]) -> Any:
    """The runner a worker probes with: the search's own kind, a fresh process per probe, on the worker's devices."""
    runner = ProcessRunner(job.factory, job.budget_bytes, folder, timeout_s=job.timeout_s,
                           build_timeout_s=job.build_timeout_s, rung_steps=job.rung_steps)
    return runner.on_devices(devices) if devices else runner


RunnerFor = Callable[[Any, Path, Optional[Sequence[str]]], Any]


def serve(location: str, workdir: Path, devices: Optional[Sequence[str]] = None, *,
          idle_exit_s: Optional[float] = None, beat_s: float = BEAT_S, name: Optional[str] = None,
          runner_for: RunnerFor = process_runner) -> int:
    """Serve probes until the searches served have ended; returns how many probes this worker ran. ``runner_for``:
    the runner of a job (a fake one in tests)."""
    shown = masked(location)
    # the key is read when the first probe is taken: a worker started beside its search (srun) may start before the
    # search has written the key, never after its queue study is open
    queue = ProbeQueue(open_storage(location), where=shown)
    worker = name or f"{socket.gethostname()}:{os.getpid()}"
    count = len(devices) if devices else max(1, visible_gpu_count())
    log.info("autofit worker %s: probes from %s on %s", worker, shown,
             f"device(s) {','.join(devices)}" if devices else f"{count} device(s)")
    served, seen, idle_since = 0, False, time.monotonic()
    while True:
        names, _ = queue.open_studies()
        seen = seen or bool(names)
        taken = queue.take(names, count, worker) if names else None
        if taken is None:
            if seen and not names:
                log.info("autofit worker %s: the searches have ended, after %d probe(s)", worker, served)
                return served
            if idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                log.info("autofit worker %s: no probe for %g s; leaving", worker, idle_exit_s)
                return served
            time.sleep(POLL_S)
            continue
        run_one(queue, taken, workdir, devices, beat_s, runner_for, worker)
        served += 1
        idle_since = time.monotonic()


def run_one(queue: ProbeQueue, taken: Taken, workdir: Path, devices: Optional[Sequence[str]], beat_s: float,
            runner_for: RunnerFor = process_runner, worker: str = "a worker") -> None:
    """Run one probe taken from the queue and give its result back. Interrupted (Ctrl-C), the probe is handed back
    at once and ``KeyboardInterrupt`` goes on; a queue that can no longer be read stops the probe, and goes on."""
    job = taken.job
    if not isinstance(job, ProbeJob):  # signed, yet not a probe: another tool's, or another version's
        queue.fail(taken.trial_id, f"refused by a worker: its job is a {type(job).__name__}, not a probe")
        log.warning("autofit worker: trial %d of %s is not a probe (a %s): not run", taken.number,
                    one_line(taken.study), type(job).__name__)
        return
    folder = Path(workdir) / re.sub(r"[^A-Za-z0-9._-]+", "_", taken.study)[-120:]
    runner = runner_for(job, folder, devices)
    stop = getattr(runner, "stop", None) or threading.Event()
    log.info("probe %s (trial %d of %s)", job.candidate.describe(), taken.number, one_line(taken.study))
    done, unreadable = threading.Event(), []

    def heartbeat() -> None:
        count = 0
        while not done.wait(beat_s):
            count += 1
            try:
                going_on = queue.beat(taken.trial_id, count)
            except QueueUnreadable as exc:  # said by run_one, once the probe has stopped
                unreadable.append(exc)
                going_on = False
            if not going_on:  # given up on, or no longer needed: stop probing
                stop.set()
                return

    beating = threading.Thread(target=heartbeat, name="autofit-heartbeat", daemon=True)
    beating.start()
    try:
        result = runner.run(job.candidate, **job.plan)
    except KeyboardInterrupt:  # handed out again now, not after the search's wait for a heartbeat
        _give_back(queue, taken, f"lost: {worker} was interrupted")
        raise
    except ProbeCancelled:
        if unreadable:
            raise unreadable[0] from None
        queue.fail(taken.trial_id, "cancelled")
        log.info("probe %s: cancelled by its search", job.candidate.describe())
        return
    except Exception as exc:  # noqa: BLE001 - the search is told why, and this worker serves on
        reason = f"{type(exc).__name__}: {clip(one_line(exc), 300)}"
        queue.fail(taken.trial_id, reason)
        log.warning("probe %s could not run here: %s", job.candidate.describe(), reason)
        return
    finally:
        done.set()
        beating.join()
    if unreadable:
        raise unreadable[0]
    if not queue.finish(taken, result.to_dict(), result.tokens_per_second):
        log.warning("probe %s: its search had handed it out again; this result is dropped",
                    job.candidate.describe())


def _give_back(queue: ProbeQueue, taken: Taken, reason: str) -> None:
    """Hand an interrupted probe back; a second Ctrl-C while that is written is not a traceback."""
    try:
        queue.fail(taken.trial_id, reason)
    except (KeyboardInterrupt, QueueUnreadable):
        pass
