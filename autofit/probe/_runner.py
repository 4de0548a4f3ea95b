"""Runs each probe in a fresh process and turns whatever happens to it into a ``ProbeResult``.

Probe processes are forked from a multiprocessing *forkserver* that has imported torch, transformers and trl once
but never touched CUDA (``autofit.probe._preload``): each probe is still a new process (its own CUDA context, allocator
and peak statistics, nothing left over from an earlier OOM), without paying several seconds of imports every time.
If a probe reports that it was forked from a server where CUDA had been initialized after all (a "bad fork"), the
runner switches to the *spawn* start method for the rest of the search, says so once, and runs that probe again.
A probe that hangs is killed at its timeout; one that dies is reported as a crash; the search goes on.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import multiprocessing
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Protocol, Sequence, Tuple, Union

from autofit.core import INFRASTRUCTURE, Candidate, Outcome, ProbeResult, ProbeSettings, clip, format_size
from autofit.machine import DISTURBED_RETRY_WAIT_S, PHASE_FILE, PID_FILE, disturbed
from autofit.probe import _ranks as ranks
from autofit.probe._child import THREADS_ENV
from autofit.probe._classify import BAD_FORK, classify_exit
from autofit.probe._factory import FactoryPayload, prepare_factory
from autofit.probe._progress import PlainProgress, ProbeProgress

log = logging.getLogger(__name__)

PRELOAD = ("autofit.probe._preload",)
_STARTING = threading.Lock()
POLL_S = 0.5  # how often a running probe's phase is read for the progress display


class Runner(Protocol):
    """Anything that measures one candidate. The search only ever talks to this.

    ``time_cap_s``: stop once this many seconds of training have passed and ``min_steps`` optimizer steps have
    run (a verification bounded by time as well as by ``steps``). ``full_accumulation``: run every micro-batch of
    an SFT or reward step, not just the two that show its peak (``Candidate.probe_accumulation``)."""

    def run(self, candidate: Candidate, steps: int, *, min_steps: int = 0, time_cap_s: Optional[float] = None,
            full_accumulation: bool = False) -> ProbeResult: ...


class ProbeCancelled(Exception):
    """A probe stopped, and its process killed, because its runner's ``stop`` was set: a probe started ahead of
    the walk that the walk no longer needs (``autofit.search._slots``)."""


class ProcessRunner:
    def __init__(self, factory: Union[str, FactoryPayload], budget_bytes: Optional[int], workdir: Path,
                 timeout_s: float = 900.0, *, preload: Sequence[str] = PRELOAD, start_method: str = "forkserver",
                 build_timeout_s: Optional[float] = None, progress: Optional[ProbeProgress] = None,
                 rung_steps: Tuple[Tuple[str, str], ...] = ()):
        self.factory = factory if isinstance(factory, FactoryPayload) else prepare_factory(factory)
        # (rung name, probe step path) of the ladder's rungs (``autofit.rungs.probe_steps``): a probe is a fresh
        # process, which imports them (the built-in rungs' it considers anyway)
        self.rung_steps = tuple(rung_steps)
        self.build_timeout_s = build_timeout_s
        self.budget_bytes = budget_bytes
        self.workdir = Path(workdir)
        self.timeout_s = timeout_s
        self._context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._context.set_forkserver_preload(list(preload))
        self._count = 0
        self.progress = progress or PlainProgress()
        self.device_env: Dict[str, str] = {}  # the devices a probe may see, where probes run side by side
        self.stop = threading.Event()  # set: running probes are killed (ProbeCancelled); shared by on_devices' copies
        self._origin = self  # the runner on_devices copied from: what a copy learns about the machine, it keeps

    def on_devices(self, devices: Sequence[str], threads: Optional[int] = None) -> ProcessRunner:
        """This runner, its probes seeing only ``devices`` (their CUDA indices; on the CPU meter a name only) and,
        where given, using ``threads`` of the host's cores (torch's and OpenMP's)."""
        runner = copy.copy(self)
        runner.device_env = {"CUDA_VISIBLE_DEVICES": ",".join(devices)}
        if threads:
            runner.device_env.update({THREADS_ENV: str(threads), "OMP_NUM_THREADS": str(threads)})
        return runner

    @property
    def start_method(self) -> str:
        return self._context.get_start_method()

    def run(self, candidate: Candidate, steps: int, *, min_steps: int = 0, time_cap_s: Optional[float] = None,
            full_accumulation: bool = False) -> ProbeResult:
        plan = dict(steps=steps, min_steps=min_steps, time_cap_s=time_cap_s, full_accumulation=full_accumulation)
        result = self._run_once(candidate, plan)
        if result.cause == BAD_FORK and self.start_method != "spawn":
            log.warning("probe processes cannot be forked on this machine (%s): using the spawn start method for "
                        "the rest of the search (each probe imports torch and transformers again)", result.error)
            self._context = self._origin._context = multiprocessing.get_context("spawn")  # and for later copies
            result = self._run_once(candidate, plan)
        for attempt in range(2):
            if result.outcome is not Outcome.OOM or not disturbed(result.stats, self.budget_bytes):
                break
            grown = result.stats["others_end_bytes"] - result.stats["others_start_bytes"]
            if attempt == 0:
                log.warning("probe disturbed: another process on the device grew by %s while it ran out of memory; "
                            "running it again in %.0f s", format_size(grown), DISTURBED_RETRY_WAIT_S)
                time.sleep(DISTURBED_RETRY_WAIT_S)
                result = self._run_once(candidate, plan)
            else:  # twice: no answer about this candidate, and not "does not fit"
                result = replace(result, outcome=Outcome.CRASH, fault=INFRASTRUCTURE, cause="disturbed",
                                 error=f"disturbed twice: another process on the device grew by {format_size(grown)} "
                                       f"while the probe ran out of memory ({clip(result.error, 200)})")
        return result

    def _run_once(self, candidate: Candidate, plan: dict) -> ProbeResult:
        from autofit.probe._worker import child_main

        self._count += 1
        steps = plan["steps"]
        suffix = f"{steps}" + (f"-cap{plan['time_cap_s']:g}" if plan["time_cap_s"] is not None else "") + (
            "-full" if plan["full_accumulation"] else "")
        probe_dir = self.workdir / "probes" / f"{candidate.key()}-{suffix}"
        probe_dir.mkdir(parents=True, exist_ok=True)
        result_path = probe_dir / "result.json"
        result_path.unlink(missing_ok=True)
        (probe_dir / PHASE_FILE).unlink(missing_ok=True)  # an earlier run's last phase
        for name in ("probe.log", PID_FILE):  # a link planted here is removed, never written through
            if (probe_dir / name).is_symlink():
                (probe_dir / name).unlink()
        candidate = candidate.replace(probe=ProbeSettings(output_dir=str(probe_dir / "trainer"),
                                                          build_timeout_s=self.build_timeout_s,
                                                          rung_steps=self.rung_steps, **plan))
        if candidate.ranks > 1:
            return self._run_ranks(candidate, probe_dir)
        # typeshed's BaseContext (what get_context(str) returns) lacks Process; every real context has it
        process = self._context.Process(  # type: ignore[attr-defined]
            target=child_main,
            args=(self.factory, candidate, self.budget_bytes, str(result_path), str(probe_dir / "probe.log")),
            kwargs={"env": dict(self.device_env)}, name=f"autofit-probe-{self._count}",
        )
        started = time.time()
        with _main_module_left_alone(self._context):
            process.start()
        stopped = False
        try:
            self._wait(process, probe_dir)
            timed_out = process.is_alive()
            stopped = timed_out and _stopped(process.pid)  # frozen (SIGSTOP), not slow: not the candidate's time
            if timed_out:
                process.kill()
                process.join()
        except BaseException:  # interrupted: take the probe down with us
            process.kill()
            process.join()
            raise
        finally:
            (probe_dir / PID_FILE).unlink(missing_ok=True)
        if result_path.exists():
            return ProbeResult.from_dict(json.loads(result_path.read_text()))
        result = classify_exit(process.exitcode, timed_out, _last_phase(probe_dir), not self.factory.builtin,
                               stopped=stopped, started=started)
        result.log_path = str(probe_dir / "probe.log")
        return result

    def _run_ranks(self, candidate: Candidate, probe_dir: Path) -> ProbeResult:
        """One process per rank (``autofit.probe._ranks``); all of them killed at the time limit, the others shortly
        after one has failed."""
        from autofit.probe._worker import child_main
        from autofit.rungs import free_port, rank_env

        port, processes, folders = free_port(), [], []
        for rank in range(candidate.ranks):
            folder = ranks.rank_dir(probe_dir, rank)
            folder.mkdir(parents=True, exist_ok=True)
            for name in ("result.json", PHASE_FILE):
                (folder / name).unlink(missing_ok=True)
            folders.append(folder)
            processes.append(self._context.Process(  # type: ignore[attr-defined]  # as in _run_once
                target=child_main, args=(self.factory, candidate, self.budget_bytes, str(folder / "result.json"),
                                         str(folder / "probe.log")),
                kwargs={"env": {**rank_env(rank, candidate.ranks, port), **self.device_env}},
                name=f"autofit-probe-{self._count}-rank{rank}"))
        started = time.time()
        try:
            with _main_module_left_alone(self._context):
                for process in processes:
                    process.start()
            timed_out, killed = self._wait_ranks(processes, folders, probe_dir)
        except BaseException:  # interrupted: take every rank down with us
            for process in processes:
                process.kill()
                process.join()
            raise
        finally:
            for folder in folders:
                (folder / PID_FILE).unlink(missing_ok=True)
        results = []
        for folder, process, was_killed in zip(folders, processes, killed, strict=True):
            path = folder / "result.json"
            result = ProbeResult.from_dict(json.loads(path.read_text())) if path.exists() else \
                classify_exit(process.exitcode, timed_out and was_killed, _last_phase(folder), not self.factory.builtin,
                              started=started)
            result.log_path = result.log_path or str(folder / "probe.log")
            results.append(result)
        return ranks.combine(results, [k and not timed_out for k in killed])

    def _wait_ranks(self, processes, folders, probe_dir: Path):
        """Wait for every rank; returns (the time limit was reached, which ranks were killed)."""
        deadline, grace_end = time.monotonic() + self.timeout_s, None
        while any(p.is_alive() for p in processes):
            self._check_stop()
            now = time.monotonic()
            if now >= deadline or (grace_end is not None and now >= grace_end):
                break
            processes[0].join(POLL_S)
            self.progress.poll(probe_dir)
            if grace_end is None:
                written = [ProbeResult.from_dict(json.loads((f / "result.json").read_text()))
                           if (f / "result.json").exists() else None for f in folders]
                if ranks.first_failure(written, [p.exitcode for p in processes]):
                    grace_end = time.monotonic() + ranks.RANK_GRACE_S
        killed = [p.is_alive() for p in processes]
        for process in processes:
            if process.is_alive():
                process.kill()
            process.join()
        return time.monotonic() >= deadline and any(killed), killed

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise ProbeCancelled("stopped: the search no longer needs this probe")

    def _wait(self, process, probe_dir: Path) -> None:
        """``process.join(self.timeout_s)``, in slices, showing the probe's progress between them."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._check_stop()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            process.join(min(POLL_S, left))
            if not process.is_alive():
                return
            self.progress.poll(probe_dir)


@contextlib.contextmanager
def _main_module_left_alone(context: Any = None) -> Iterator[None]:
    """Start a probe without multiprocessing re-running the parent's ``__main__`` in it.

    multiprocessing hands every child the parent's main module (its file, or its module name) to run again as
    ``__mp_main__``, so that functions defined there can be unpickled by name. Probes do not need it (factories
    cross by value) and it does harm: a script fed on stdin has no file to run ("<stdin>"), and a script's top-level
    code (a dataset loaded, a tensor put on the GPU) would run again in every probe. Hidden while the child starts.

    ``context``: the one the child starts in; a forkserver's server is started first, Ctrl-C ignored (below)."""
    with _STARTING:  # probes side by side start from threads: one hides and restores at a time
        if context is not None and context.get_start_method() == "forkserver":
            _server_deaf_to_ctrl_c()
        main = sys.modules["__main__"]
        saved: Dict[str, Any] = {key: main.__dict__[key] for key in ("__file__", "__spec__") if key in main.__dict__}
        main.__dict__.pop("__file__", None)
        if "__spec__" in saved:
            main.__spec__ = None
        try:
            yield
        finally:
            main.__dict__.update(saved)


def _server_deaf_to_ctrl_c() -> None:
    """Start the probe server (where it is not running) with SIGINT ignored, which it keeps: Ctrl-C reaches every
    process of the terminal's group, and multiprocessing's server ignores it only once its preload is done, so a
    Ctrl-C during its seconds of importing torch printed a 30-line traceback under the search's or the worker's one
    line. The server is spawned in milliseconds (the preload runs after); a Ctrl-C within them is lost, the next is
    not. Signals are set from the main thread only: from a slot's thread the server starts as it would
    (``_preload`` ignores SIGINT as soon as it runs)."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


def _last_phase(folder: Path) -> str:
    """The phase a probe recorded last (``PHASE_FILE``), "" where it recorded none."""
    try:
        return (folder / PHASE_FILE).read_text(errors="replace").strip()
    except OSError:
        return ""


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, SIGTSTP, a debugger), as ``/proc/PID/stat`` says; False where it cannot
    tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] in ("T", "t")
