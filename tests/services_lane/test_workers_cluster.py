"""Issue 49, item 2, as a cluster runs it: `autofit search --workers 2` and two `autofit worker` processes (two "nodes",
each its own process group, as srun starts them) share a queue in a folder, a real Redis server and a real PostgreSQL
server; the first worker is killed (SIGKILL, its probe with it) while it probes, the second joins after, the lost probe
is handed out again, and the search ends with the answer and the probes of the one-at-a-time search.

Issue 57: the Redis server asks a password, given as the docs show first ($AUTOFIT_QUEUE_PASSWORD, not on the command
line); PostgreSQL's is in the URL, as a user may still write it. Neither appears in any output, file or lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autofit.workers import PASSWORD_ENV, ProbeQueue, open_storage
from autofit.workers._queue import REASON, WORKER

AUTOFIT = [sys.executable, "-m", "autofit.cli"]
QUESTION = ["--model", "tiny-qwen2", "--algo", "sft", "--device", "cpu", "--gpu-memory", "300MiB", "--max-length",
            "256", "--effective-batch", "8", "-q"]
WAIT_S = 420


def answer(out: Path):
    best = json.loads((out / "best.json").read_text())
    return best["config"], [(c["kind"], c["candidate"], c["outcome"]) for c in best["candidates"]]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "out"
    subprocess.run([*AUTOFIT, "search", *QUESTION, "--out", str(out)], check=True, timeout=WAIT_S,
                   capture_output=True)
    return answer(out)


def worker(location: str, workdir: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([*AUTOFIT, "worker", "--study", location, "--workdir", str(workdir)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def running_on(location: str, pid: int, seconds: float = 180.0) -> bool:
    """Whether the worker of ``pid`` is probing (its trial RUNNING in the queue) within ``seconds``."""
    queue, deadline = ProbeQueue(open_storage(location)), time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name in queue.open_studies()[0]:
            study_id = queue.storage.get_study_id_from_name(name)
            if any(t.state.name == "RUNNING" and str(t.user_attrs.get(WORKER, "")).endswith(f":{pid}")
                   for t in queue.storage.get_all_trials(study_id, deepcopy=False)):
                return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("storage", ["folder", "redis", "postgresql"])
def test_two_workers_finish_a_search_one_killed_mid_probe(storage, serial, tmp_path, request, monkeypatch,
                                                         service_passwords):
    out = tmp_path / "out"
    redis_password, pg_password = service_passwords
    if storage == "redis":
        monkeypatch.setenv(PASSWORD_ENV, redis_password)  # the search, its workers and this test's own reads
    location = {"folder": lambda: str(tmp_path / "shared"), "redis": lambda: request.getfixturevalue("redis_url"),
                "postgresql": lambda: request.getfixturevalue("postgres_url")}[storage]()
    with open(tmp_path / "search.log", "w") as log:
        search = subprocess.Popen([*AUTOFIT, "search", *QUESTION, "--out", str(out), "--workers", "2",
                                   "--worker-queue", location, "--worker-silence", "5"], stdout=log,
                                  stderr=subprocess.STDOUT)
    first = second = None
    try:
        first = worker(location, tmp_path / "node-a", tmp_path / "node-a.log")
        assert running_on(location, first.pid), (tmp_path / "node-a.log").read_text()
        os.killpg(first.pid, signal.SIGKILL)  # the node dies: the worker and the probe it ran
        first.wait(timeout=30)
        second = worker(location, tmp_path / "node-b", tmp_path / "node-b.log")
        assert search.wait(timeout=WAIT_S) == 0, (tmp_path / "search.log").read_text()[-3000:]
        assert second.wait(timeout=60) == 0, (tmp_path / "node-b.log").read_text()[-3000:]
    finally:
        for process in (search, first, second):
            if process is not None and process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
    assert answer(out) == serial  # the same configuration, from the same probes
    queue = ProbeQueue(open_storage(location))
    study = queue.storage.get_study_id_from_name(ProbeQueue.study_name(out))
    trials = queue.storage.get_all_trials(study, deepcopy=False)
    lost = [t for t in trials if str(t.user_attrs.get(REASON, "")).startswith("lost: ") and
            str(t.user_attrs.get(WORKER)).endswith(f":{first.pid}")]
    assert len(lost) == 1  # the probe the killed node ran
    again = [t for t in trials if t.number > lost[0].number and t.user_attrs["job"] == lost[0].user_attrs["job"]]
    assert again and again[0].state.name == "COMPLETE"
    assert str(again[0].user_attrs[WORKER]).endswith(f":{second.pid}")
    said = (tmp_path / "search.log").read_text()
    assert "handing it out again" in said and "handed out to 2 workers" in said
    best = json.loads((out / "best.json").read_text())
    assert best["side_by_side"]["workers"] is True and len(best["side_by_side"]["devices"]) == 2
    assert any("1 probe(s) handed out again: their worker gave no heartbeat for 5 s" in note for note in best["notes"])
    files = [tmp_path / name for name in ("search.log", "node-a.log", "node-b.log")] + \
        [out / name for name in ("best.json", "best.yaml", "search.lock", "report.html")]
    for path in files:
        text = path.read_text(errors="replace")
        assert redis_password not in text and pg_password not in text, path
    if storage == "postgresql":  # the search runs -q: its "start autofit worker" line is checked in tests/workers
        assert best["request"]["worker_queue"].startswith("postgresql://postgres:***@")
