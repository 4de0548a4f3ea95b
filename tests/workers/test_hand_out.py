"""Probes handed out to workers through a shared queue (issue 49, item 2; autofit.workers): the search's answer and
probes are the one-at-a-time search's, a worker that goes silent has its probe handed out again (its late result
refused), a probe the search no longer needs is cancelled, and a queue that cannot be used is one line. The queue is
a real Optuna journal file; the workers are threads running ``serve`` with a fake runner whose memory is a formula
(Lightning's tuner tests' way). Real worker processes against real Redis and PostgreSQL servers: tests/services_lane."""

from __future__ import annotations

import threading
import time

import pytest
from fakes import formula_spec

from autofit.core import Candidate, InputError, ProbeResult
from autofit.probe import FactoryPayload, ProbeCancelled, prepare_factory
from autofit.rungs import resolve_ladder
from autofit.search import Search, SlotRunner
from autofit.workers import HandOutRunner, ProbeQueue, open_storage, serve
from autofit.workers._queue import BEAT, CLOSED, REASON, WORKER
from autofit.workers._signing import queue_key

try:
    from fakes import FormulaRunner, MiB
except ImportError:  # tests/ became a package
    from tests.fakes import FormulaRunner, MiB

BUDGET = 620 * MiB  # the default ladder walks a level, then checkpointing fits (as tests/search/test_slots.py)
CANDIDATE = Candidate(algo="sft", model="tiny-qwen2", device="cuda", micro_batch=1, grad_accum=8, max_length=64)


@pytest.fixture(autouse=True)
def _the_searchs_queue_key():
    """The queue key a search with --workers writes before it puts a probe: this module's tests put probes through
    ProbeQueue without a search, so the key is made here (it was there only when an earlier test of the same pytest
    worker had run a search: under -n 2 the read-back test once ran first and found no key)."""
    queue_key(create=True)


class SlowFormulaRunner(FormulaRunner):
    """A ``FormulaRunner`` whose probes take a little time, so that workers' probes overlap."""

    def __init__(self, *args, seconds: float = 0.1, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = seconds
        self.stop = threading.Event()

    def run(self, candidate, steps, **plan):
        time.sleep(self.seconds)
        return super().run(candidate, steps, **plan)


def fake_runner(job, folder, devices):
    return SlowFormulaRunner(BUDGET)


def start_worker(location, tmp_path, name, **kwargs):
    served = {}

    def work():
        served["count"] = serve(location, tmp_path / name, beat_s=0.05, name=name, runner_for=fake_runner,
                                idle_exit_s=20, **kwargs)

    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    return thread, served


def hand_out_runner(location, out_dir, lost_after_s=30.0):
    return HandOutRunner(str(location), out_dir, prepare_factory("sft"), BUDGET, timeout_s=60,
                         lost_after_s=lost_after_s)


def probe_records(report):
    return [(r.candidate.key(), r.result.outcome, r.result.peak_bytes) for r in report.records if r.kind == "probe"]


def test_two_workers_find_the_serial_answer_with_the_same_probes(tmp_path):
    serial = Search(formula_spec(tmp_path / "serial", BUDGET), FormulaRunner(BUDGET), resolve_ladder(None)).run()
    hand_out = hand_out_runner(tmp_path / "queue", tmp_path / "handed")
    workers = [start_worker(str(tmp_path / "queue"), tmp_path, name) for name in ("node-a", "node-b")]
    slots = SlotRunner(hand_out, ["worker-0", "worker-1"], per_rank=False)
    try:
        handed = Search(formula_spec(tmp_path / "handed", BUDGET), slots, resolve_ladder(None)).run()
    finally:
        slots.close()
        hand_out.close()
    for thread, _ in workers:
        thread.join(timeout=30)
        assert not thread.is_alive()  # the search closed its queue, and the workers left
    assert handed.chosen.candidate.key() == serial.chosen.candidate.key()
    assert probe_records(handed) == probe_records(serial)
    served = [count["count"] for _, count in workers]
    assert all(served) and sum(served) >= slots.started  # both nodes probed, cancelled ones counted as served
    trials = hand_out.study.get_trials(deepcopy=False)
    assert {t.user_attrs[WORKER] for t in trials if WORKER in t.user_attrs} == {"node-a", "node-b"}
    assert hand_out.study.user_attrs[CLOSED] is True
    assert handed.verified.fits


def test_a_silent_workers_probe_is_handed_out_again_and_its_late_result_refused(tmp_path):
    location = str(tmp_path / "queue")
    hand_out = hand_out_runner(location, tmp_path / "out", lost_after_s=0.5)
    answer = {}
    asking = threading.Thread(target=lambda: answer.update(result=hand_out.run(CANDIDATE, 2)), daemon=True)
    asking.start()
    silent = ProbeQueue(open_storage(location))  # a worker on a node that dies: it takes the probe, then nothing
    deadline, taken = time.monotonic() + 20, None
    while taken is None and time.monotonic() < deadline:
        taken = silent.take(silent.open_studies()[0], 1, "node-dead")
        time.sleep(0.05)
    assert taken is not None and taken.job.candidate == CANDIDATE
    thread, served = start_worker(location, tmp_path, "node-alive")
    asking.join(timeout=30)
    result = answer["result"]
    assert result.fits and result.steps == 2
    assert hand_out.lost == 1 and hand_out.handed_out == 2
    first, second = hand_out.study.get_trials(deepcopy=False)
    assert first.state.name == "FAIL" and first.user_attrs[REASON].startswith("lost: node-dead gave no heartbeat")
    assert second.state.name == "COMPLETE" and second.user_attrs[WORKER] == "node-alive" and second.user_attrs[BEAT]
    assert not silent.finish(taken, ProbeResult.from_dict(second.user_attrs["result"]).to_dict(), 1.0)
    assert not silent.beat(taken.trial_id, 1)  # the dead node, back, is told to stop
    hand_out.close()
    thread.join(timeout=30)
    assert served["count"] == 1


def test_a_probe_no_longer_needed_is_cancelled_waiting_or_running(tmp_path):
    location = str(tmp_path / "queue")
    hand_out = hand_out_runner(location, tmp_path / "out")
    hand_out.stop.set()  # before any worker takes it: the waiting trial is failed
    with pytest.raises(ProbeCancelled):
        hand_out.run(CANDIDATE, 2)
    (waiting,) = hand_out.study.get_trials(deepcopy=False)
    assert waiting.state.name == "FAIL" and waiting.user_attrs[REASON] == "cancelled"
    hand_out.stop.clear()
    worker = ProbeQueue(open_storage(location))
    trial_id = hand_out.queue.put(hand_out.study, "a job", 1)
    taken = worker.take(worker.open_studies()[0], 1, "node-a")
    assert taken is not None and taken.trial_id == trial_id and worker.beat(trial_id, 1)
    hand_out.queue.cancel(trial_id)  # running: the worker's next heartbeat says stop
    assert not worker.beat(trial_id, 2)


def test_one_taker_only_and_only_a_worker_with_devices_enough(tmp_path):
    location = str(tmp_path / "queue")
    queue = ProbeQueue(open_storage(location))
    study = queue.open_study(ProbeQueue.study_name(tmp_path / "out"))
    queue.put(study, "two-rank job", 2)
    one_device, other = ProbeQueue(open_storage(location)), ProbeQueue(open_storage(location))
    names = one_device.open_studies()[0]
    assert one_device.take(names, 1, "small") is None  # it needs two devices
    first = one_device.take(names, 2, "a")
    assert first is not None and first.job == "two-rank job"
    assert other.take(names, 2, "b") is None  # taken already
    queue.put(study, "left waiting", 1)
    reopened = ProbeQueue(open_storage(location)).open_study(study.study_name)  # the search run again
    assert [t.state.name for t in reopened.get_trials(deepcopy=False)] == ["FAIL", "FAIL"]
    assert reopened.user_attrs[CLOSED] is False


def test_a_probe_taken_before_the_search_reads_it_back_is_still_the_searchs(tmp_path, monkeypatch):
    location = str(tmp_path / "queue")
    queue = ProbeQueue(open_storage(location))
    study = queue.open_study(ProbeQueue.study_name(tmp_path / "out"))
    worker, enqueue, taken = ProbeQueue(open_storage(location)), study.enqueue_trial, []

    def enqueue_then_taken(*args, **kwargs):  # a worker polling the storage wins the race with the read-back
        enqueue(*args, **kwargs)
        taken.append(worker.take(worker.open_studies()[0], 1, "quick"))

    monkeypatch.setattr(study, "enqueue_trial", enqueue_then_taken)
    trial_id = queue.put(study, "job", 1)
    assert taken[0] is not None and taken[0].trial_id == trial_id
    assert queue.trial(trial_id).state.name == "RUNNING"


@pytest.mark.parametrize("location, words", [
    ("ftp://host/queue", "has a scheme autofit does not read"),
    ("redis://127.0.0.1:9", "cannot be reached"),
    ("postgresql://user:secret@127.0.0.1:9/db", "cannot be reached"),
])
def test_a_queue_that_cannot_be_used_is_one_line(location, words):
    with pytest.raises(InputError) as raised:
        open_storage(location)
    message = str(raised.value)
    assert words in message and "\n" not in message and "secret" not in message


def test_a_file_is_not_a_queue_folder(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="is a file: a folder"):
        open_storage(str(tmp_path / "file"))


def test_the_job_carries_what_the_searchs_own_runner_would_run(tmp_path):
    hand_out = HandOutRunner(str(tmp_path / "q"), tmp_path / "out", FactoryPayload(ref="pkg.mod:build", name="x"),
                             BUDGET, timeout_s=77, lost_after_s=5, build_timeout_s=33, rung_steps=[("r", "m:f")])
    hand_out.stop.set()
    with pytest.raises(ProbeCancelled):
        hand_out.run(CANDIDATE, 3, min_steps=2, time_cap_s=9.0, full_accumulation=True)
    taken = ProbeQueue(open_storage(str(tmp_path / "q")))
    (trial,) = hand_out.study.get_trials(deepcopy=False)
    import base64
    import pickle

    job = pickle.loads(base64.b64decode(trial.user_attrs["job"]))
    assert job.factory.ref == "pkg.mod:build" and job.budget_bytes == BUDGET and job.timeout_s == 77
    assert job.build_timeout_s == 33 and job.rung_steps == (("r", "m:f"),) and job.candidate == CANDIDATE
    assert job.plan == dict(steps=3, min_steps=2, time_cap_s=9.0, full_accumulation=True)
    assert taken.open_studies() == ([hand_out.study_name], 0)


class Interrupted:
    """A probe interrupted by Ctrl-C on the worker's machine."""

    stop = threading.Event()

    def run(self, candidate, steps, **plan):
        raise KeyboardInterrupt


def test_an_interrupted_worker_gives_its_probe_back_at_once(tmp_path):
    from autofit.workers._serve import run_one

    location = str(tmp_path / "queue")
    hand_out = hand_out_runner(location, tmp_path / "out", lost_after_s=600)  # silence alone would take 10 minutes
    answer = {}
    asking = threading.Thread(target=lambda: answer.update(result=hand_out.run(CANDIDATE, 2)), daemon=True)
    asking.start()
    queue, deadline, taken = ProbeQueue(open_storage(location)), time.monotonic() + 20, None
    while taken is None and time.monotonic() < deadline:
        taken = queue.take(queue.open_studies()[0], 1, "node-x")
        time.sleep(0.05)
    with pytest.raises(KeyboardInterrupt):
        run_one(queue, taken, tmp_path / "node-x", None, 0.05, lambda *_: Interrupted(), "node-x")
    thread, _ = start_worker(location, tmp_path, "node-y")
    asking.join(timeout=30)
    assert answer["result"].fits
    first, second = hand_out.study.get_trials(deepcopy=False)
    assert first.user_attrs[REASON] == "lost: node-x was interrupted" and second.user_attrs[WORKER] == "node-y"
    hand_out.close()
    thread.join(timeout=30)


@pytest.mark.parametrize("argv, words", [
    (["worker", "--study", "ftp://host/q"], "has a scheme autofit does not read"),
    (["worker", "--study", "QUEUE", "--gpus-for-probes", "0,0"], "--gpus-for-probes '0,0': distinct device indices"),
    (["worker", "--study", "QUEUE", "--idle-exit", "-1"], "--idle-exit '-1': a positive, finite number of seconds"),
    (["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--workers", "2",
      "--gpus-for-probes", "0,1", "--out", "OUT"], "--workers and --gpus-for-probes both say where probes run"),
    (["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--worker-queue", "QUEUE",
      "--out", "OUT"], "applies with --workers N"),
    (["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--workers", "2",
      "--worker-queue", "ftp://host/q", "--out", "OUT"], "the queue ftp://host/q has a scheme autofit does not read"),
    (["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--workers", "0",
      "--out", "OUT"], "--workers"),
])
def test_bad_worker_options_are_one_line_and_exit_2(argv, words, tmp_path, capsys):
    from autofit.cli import main

    argv = [str(tmp_path / word) if word in ("QUEUE", "OUT") else word for word in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err, err
    assert not (tmp_path / "OUT" / "best.json").exists()
