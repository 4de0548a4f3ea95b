"""The queue's lifecycle with real processes (issue 57, item 3): a search ended by SIGTERM (a scheduler's scancel)
closes its queue study, so no probe is left for a worker started later; a worker Ctrl-C'd while it probes hands its
probe back at once and says so in one line (the probe server's start-up imports printed a KeyboardInterrupt
traceback). Each on the CPU with the bundled tiny model, a worker's probe a real one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from autofit.workers import ProbeQueue, open_storage
from autofit.workers._queue import REASON

AUTOFIT = [sys.executable, "-m", "autofit.cli"]
SEARCH = ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--max-length", "128",
          "--workers", "1", "--worker-silence", "600"]


def interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a job started in the background inherits SIGINT ignored


def trials(location):
    queue = ProbeQueue(open_storage(location))
    study = queue.storage.get_study_id_from_name(ProbeQueue.study_name(location))
    return queue.storage.get_all_trials(study, deepcopy=False)


def wait_for(predicate, seconds=240.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except KeyError:  # the study is not there yet
            pass
        time.sleep(0.2)
    return False


def test_a_terminated_search_leaves_no_probe_for_a_later_worker(tmp_path):
    out = tmp_path / "out"
    with open(tmp_path / "search.log", "w") as log:
        search = subprocess.Popen([*AUTOFIT, *SEARCH, "--out", str(out)], stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=interruptible)
    try:
        assert wait_for(lambda: trials(str(out))), (tmp_path / "search.log").read_text()
        search.send_signal(signal.SIGTERM)
        assert search.wait(timeout=60) == 143
    finally:
        if search.poll() is None:
            search.kill()
    said = (tmp_path / "search.log").read_text()
    assert said.rstrip().splitlines()[-1].startswith("autofit: interrupted; run the same command again"), said
    assert "Traceback" not in said
    assert [t.state.name for t in trials(str(out))] == ["FAIL"]
    assert ProbeQueue(open_storage(str(out))).open_studies() == ([], 1)  # a worker started now finds nothing open


def test_a_worker_interrupted_mid_probe_hands_it_back_in_one_line(tmp_path):
    out = tmp_path / "out"
    with open(tmp_path / "search.log", "w") as log:
        search = subprocess.Popen([*AUTOFIT, *SEARCH, "--out", str(out)], stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=interruptible)
    worker = None
    try:
        assert wait_for(lambda: trials(str(out))), (tmp_path / "search.log").read_text()
        with open(tmp_path / "worker.log", "w") as log:
            worker = subprocess.Popen([*AUTOFIT, "worker", "--study", str(out), "--workdir", str(tmp_path / "w")],
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=interruptible)
        assert wait_for(lambda: any(t.state.name == "RUNNING" for t in trials(str(out))))
        time.sleep(0.5)  # the probe server is importing torch and TRL: a Ctrl-C there printed its traceback
        os.killpg(worker.pid, signal.SIGINT)  # Ctrl-C in the worker's terminal: its whole process group
        assert worker.wait(timeout=60) == 130
        first = trials(str(out))[0]
        assert first.state.name == "FAIL" and first.user_attrs[REASON] == f"lost: {os.uname().nodename}:" \
            f"{worker.pid} was interrupted"
    finally:
        for process in (worker, search):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    lines = (tmp_path / "worker.log").read_text().strip().splitlines()
    assert lines[-1] == "autofit: worker interrupted; the probe it ran (if any) is handed back to its search", lines
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in lines), lines
    assert len(lines) == 3, lines  # its start, the probe, the interruption
