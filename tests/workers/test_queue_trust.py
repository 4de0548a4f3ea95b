"""What a worker trusts (issue 57): a queue is a store others may reach, so a worker runs only a job this user's search
signed, and never decodes another; a queue folder others may write to, or whose journal is a link, is refused; a
result a worker did not sign is measured again; a damaged journal, a foreign trial or a bad field is one line, the
trial failed, the worker going on. Each case here was tried as a hostile user of a shared cluster would."""

from __future__ import annotations

import base64
import os
import pickle
import threading
import time

import pytest
from optuna.trial import TrialState

from autofit.core import InputError
from autofit.workers import KEY_ENV, HandOutRunner, ProbeQueue, QueueUnreadable, open_storage, queue_key, serve
from autofit.workers._queue import JOB, RANKS, REASON, RESULT, SIGNATURE, TAG
from autofit.workers._signing import sign_job

try:
    from fakes import MiB
except ImportError:  # tests/ became a package
    from tests.fakes import MiB
from test_hand_out import CANDIDATE, fake_runner, hand_out_runner


class Planted:
    """A pickle that runs code when it is read: what a hostile user of the store puts in a job."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plant(location, name, marker, **attrs):
    """A waiting trial in a queue study of ``name``, as anyone who can write to the store can add one (on a machine
    where the user's search has made the key)."""
    queue = ProbeQueue(open_storage(location), key=queue_key(create=True))
    study = queue.open_study(name)
    payload = pickle.dumps(Planted(marker))
    user_attrs = {JOB: base64.b64encode(payload).decode(), RANKS: 1, TAG: "t"}
    user_attrs.update(attrs)
    study.enqueue_trial({}, user_attrs=user_attrs, skip_if_exists=False)
    return queue, study, payload


def only_trial(queue, study):
    (trial,) = queue.storage.get_all_trials(study._study_id, deepcopy=False)
    return trial


@pytest.mark.parametrize("signature", [None, "0" * 64, "made with another key"])
def test_a_planted_pickle_is_never_decoded(signature, tmp_path):
    location, marker = str(tmp_path / "queue"), tmp_path / "ran"
    attrs = {} if signature is None else {SIGNATURE: signature}
    if signature == "made with another key":
        attrs[SIGNATURE] = sign_job(b"k" * 64, "autofit-probes:evil", "t", pickle.dumps(Planted(marker)))
    queue, study, _ = plant(location, "autofit-probes:evil", marker, **attrs)
    assert queue.take(queue.open_studies()[0], 1, "node-a") is None
    trial = only_trial(queue, study)
    assert not marker.exists()
    assert trial.state == TrialState.FAIL and "not signed with this user's queue key" in trial.user_attrs[REASON]


def test_a_signed_job_moved_to_another_study_is_refused(tmp_path):
    location, marker = str(tmp_path / "queue"), tmp_path / "ran"
    key = queue_key(create=True)
    payload = pickle.dumps(Planted(marker))  # a job the user's search signed for its own study, copied elsewhere
    queue, study, _ = plant(location, "autofit-probes:other", marker,
                            **{SIGNATURE: sign_job(key, "autofit-probes:mine", "t", payload)})
    assert queue.take(queue.open_studies()[0], 1, "node-a") is None
    assert not marker.exists() and only_trial(queue, study).state == TrialState.FAIL


def test_a_worker_refuses_the_planted_job_and_runs_the_searchs_next(tmp_path):
    location, marker = str(tmp_path / "queue"), tmp_path / "ran"
    plant(location, "autofit-probes:evil", marker, **{RANKS: "abc"})
    plant(location, "autofit-probes:evil2", marker)
    hand_out = hand_out_runner(location, tmp_path / "out")
    answer = {}
    asking = threading.Thread(target=lambda: answer.update(result=hand_out.run(CANDIDATE, 2)), daemon=True)
    asking.start()
    served = serve(location, tmp_path / "w", beat_s=0.05, name="node-a", runner_for=fake_runner, idle_exit_s=3)
    asking.join(timeout=30)
    hand_out.close()
    assert served == 1 and answer["result"].fits and not marker.exists()
    queue = ProbeQueue(open_storage(location))
    reasons = {}
    for summary in queue.storage.get_all_studies():
        for trial in queue.storage.get_all_trials(summary._study_id, deepcopy=False):
            reasons[summary.study_name] = trial.user_attrs.get(REASON)
    assert "its field 'ranks' is 'abc', not a number of devices" in reasons["autofit-probes:evil"]
    assert "not signed" in reasons["autofit-probes:evil2"]


@pytest.mark.parametrize("study, attrs", [
    ("autofit-probes:evil", {TAG: "\ud800"}),  # a lone surrogate: no text encoding takes it
    ("autofit-probes:\ud800", {SIGNATURE: "0" * 64}),
    ("autofit-probes:evil", {SIGNATURE: "\u00e9" * 64}),  # compare_digest refuses non-ASCII text
    ("autofit-probes:evil", {TAG: ["t"], SIGNATURE: {"a": 1}}),
])
def test_a_crafted_trial_is_failed_and_the_worker_goes_on(study, attrs, tmp_path, caplog):
    location, marker = str(tmp_path / "queue"), tmp_path / "ran"
    queue, planted, _ = plant(location, study, marker, **attrs)
    served = serve(location, tmp_path / "w", beat_s=0.05, name="node-a", runner_for=fake_runner, idle_exit_s=1)
    trial = only_trial(queue, planted)
    assert served == 0 and not marker.exists()
    assert trial.state == TrialState.FAIL and trial.user_attrs[REASON].startswith("refused by a worker: ")
    assert all("\ud800" not in record.getMessage() for record in caplog.records)  # escaped: a terminal prints it


def test_a_second_ctrl_c_while_the_search_closes_its_queue_closes_it_all_the_same(tmp_path, monkeypatch):
    hand_out = hand_out_runner(str(tmp_path / "queue"), tmp_path / "out")
    hand_out.queue.put(hand_out.study, "job", 1)
    close, calls = hand_out.queue.close, []

    def interrupted_once(study):
        calls.append(study)
        if len(calls) == 1:
            raise KeyboardInterrupt
        close(study)

    monkeypatch.setattr(hand_out.queue, "close", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        hand_out.close()
    assert [t.state for t in hand_out.study.get_trials(deepcopy=False)] == [TrialState.FAIL]
    assert ProbeQueue(open_storage(str(tmp_path / "queue"))).open_studies() == ([], 1)


def test_a_lock_pointing_nowhere_is_removed_not_waited_on(tmp_path):
    folder = tmp_path / "q"
    folder.mkdir(mode=0o700)
    (folder / "queue.journal.lock").symlink_to(tmp_path / "moved-away.journal")  # Optuna's wait spun on it forever
    hand_out = hand_out_runner(str(folder), tmp_path / "out")
    hand_out.queue.put(hand_out.study, "job", 1)
    assert not (folder / "queue.journal.lock").is_symlink() or (folder / "queue.journal.lock").exists()
    hand_out.close()


def test_a_signed_job_that_is_not_a_probe_is_failed_not_run(tmp_path):
    location = str(tmp_path / "queue")
    hand_out = hand_out_runner(location, tmp_path / "out")
    trial_id = hand_out.queue.put(hand_out.study, "not a probe job", 1)
    served = serve(location, tmp_path / "w", beat_s=0.05, name="node-a", runner_for=fake_runner, idle_exit_s=1)
    assert served == 1
    trial = hand_out.queue.trial(trial_id)
    assert trial.state == TrialState.FAIL and "its job is a str, not a probe" in trial.user_attrs[REASON]
    hand_out.close()


def test_a_result_no_worker_signed_is_measured_again(tmp_path):
    location = str(tmp_path / "queue")
    hand_out = hand_out_runner(location, tmp_path / "out")
    answer = {}
    asking = threading.Thread(target=lambda: answer.update(result=hand_out.run(CANDIDATE, 2)), daemon=True)
    asking.start()
    forger, deadline, taken = ProbeQueue(open_storage(location), key=b"f" * 64), time.monotonic() + 20, None
    while taken is None and time.monotonic() < deadline:  # a store's writer that takes the trial as a worker would
        studies = forger.storage.get_all_studies()
        trials = [t for s in studies for t in forger.storage.get_all_trials(s._study_id, deepcopy=False)
                  if t.state == TrialState.WAITING]
        if trials:
            trial = trials[0]
            forger.storage.set_trial_state_values(trial._trial_id, TrialState.RUNNING)
            forger.storage.set_trial_user_attr(trial._trial_id, RESULT, {"outcome": "fits", "peak_bytes": 1})
            forger.storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, values=[1e9])
            taken = trial
        time.sleep(0.05)
    assert taken is not None
    thread = threading.Thread(target=serve, args=(location, tmp_path / "w"),
                              kwargs=dict(beat_s=0.05, name="node-b", runner_for=fake_runner, idle_exit_s=20),
                              daemon=True)
    thread.start()
    asking.join(timeout=30)
    assert answer["result"].fits and answer["result"].peak_bytes > 1 * MiB  # the honest worker's measurement
    assert hand_out.handed_out == 2
    hand_out.close()
    thread.join(timeout=30)


def test_a_world_writable_queue_folder_is_refused(tmp_path):
    folder = tmp_path / "q"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(InputError, match=r"the queue folder .* can be written by every user \(mode 0o777\)"):
        open_storage(str(folder))
    assert not (folder / "queue.journal").exists()


def test_a_linked_journal_writes_nothing_through_the_link(tmp_path):
    folder, target = tmp_path / "q", tmp_path / "precious.txt"
    folder.mkdir(mode=0o700)
    target.write_text("keep me\n")
    (folder / "queue.journal").symlink_to(target)
    with pytest.raises(InputError, match="queue.journal is a symbolic link"):
        HandOutRunner(str(folder), tmp_path / "out", None, MiB, timeout_s=5, lost_after_s=5)
    assert target.read_text() == "keep me\n"


def test_a_damaged_journal_is_one_line_naming_it(tmp_path):
    location = str(tmp_path / "queue")
    hand_out = hand_out_runner(location, tmp_path / "out")
    trial_id = hand_out.queue.put(hand_out.study, "job", 1)
    worker = ProbeQueue(open_storage(location))
    with open(tmp_path / "queue" / "queue.journal", "a") as journal:
        journal.write('{"op_code": 5, "trial_id": 99, "user_attr": {}}\n')
    for read in (lambda: worker.trial(trial_id), lambda: open_storage(location),  # while open, and opened anew
                 lambda: serve(location, tmp_path / "w", beat_s=0.05, name="node-a", runner_for=fake_runner,
                               idle_exit_s=1)):
        with pytest.raises(QueueUnreadable) as raised:
            read()
        message = str(raised.value)
        assert "queue" in message and "cannot be read (KeyError" in message and "\n" not in message
    hand_out.close()  # said, not raised: the search's own answer is what the user is told


def test_the_key_file_is_the_users_alone(tmp_path, monkeypatch, _queue_key):
    monkeypatch.delenv(KEY_ENV, raising=False)
    key = queue_key(create=True)
    assert len(key) == 64 and oct(_queue_key.stat().st_mode & 0o777) == "0o600"
    assert queue_key(create=False) == key
    _queue_key.chmod(0o644)
    try:
        with pytest.raises(InputError, match=r"others may read or write it \(mode 0o644\): chmod 600 it"):
            queue_key(create=False)
    finally:
        _queue_key.chmod(0o600)
    linked = tmp_path / "linked.key"
    linked.symlink_to(_queue_key)
    monkeypatch.setenv("AUTOFIT_QUEUE_KEY_FILE", str(linked))
    with pytest.raises(InputError, match="not a link"):
        queue_key(create=False)
    monkeypatch.setenv("AUTOFIT_QUEUE_KEY_FILE", str(tmp_path / "none.key"))
    with pytest.raises(InputError, match=f"no queue key at .*none.key: a search with --workers writes it; .*{KEY_ENV}"):
        queue_key(create=False)
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(InputError, match=f"{KEY_ENV} holds 5 characters: at least 32"):
        queue_key(create=False)


def test_optunas_own_study_line_is_not_printed(tmp_path, capfd):
    hand_out_runner(str(tmp_path / "queue"), tmp_path / "out").close()
    assert "A new study created" not in capfd.readouterr().err


def test_a_worker_without_the_key_says_so_and_blames_no_journal(tmp_path, monkeypatch, capsys):
    from autofit.cli import main

    plant(str(tmp_path / "queue"), "autofit-probes:evil", tmp_path / "ran")
    monkeypatch.setenv("AUTOFIT_QUEUE_KEY_FILE", str(tmp_path / "elsewhere.key"))
    assert main(["worker", "--study", str(tmp_path / "queue"), "--idle-exit", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autofit: error: no queue key at ") and "cannot be read" not in err and "\n" not in err


def test_a_worker_started_before_its_search_wrote_the_key_serves_it(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOFIT_QUEUE_KEY_FILE", str(tmp_path / "config" / "queue.key"))  # no key yet: srun starts
    location, served = str(tmp_path / "queue"), {}                                      # the workers first
    worker = threading.Thread(target=lambda: served.update(count=serve(
        location, tmp_path / "w", beat_s=0.05, name="node-a", runner_for=fake_runner, idle_exit_s=20)), daemon=True)
    worker.start()
    time.sleep(1.0)
    hand_out = hand_out_runner(location, tmp_path / "out")  # the search: it writes the key, then opens its study
    assert hand_out.run(CANDIDATE, 2).fits
    hand_out.close()
    worker.join(timeout=30)
    assert served["count"] == 1
