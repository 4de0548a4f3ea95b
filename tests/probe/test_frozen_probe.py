"""A probe frozen with SIGSTOP (issue 35, item 6) was charged to its candidate as a time-out, and the answer moved to
a slower rung without a word. Now it is the machine's failure, like a killed probe server: run once more, with a
note."""

import signal
import subprocess
import sys
import time

import pytest
from fakes import FormulaRunner, MiB, spec_of

from autofit.core import INFRASTRUCTURE, Candidate, Outcome
from autofit.probe import ProcessRunner
from autofit.probe._classify import classify_exit
from autofit.probe._runner import _stopped
from autofit.rungs import resolve_ladder
from autofit.search import Search


def test_a_stopped_process_is_seen_as_stopped():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not _stopped(sleeper.pid)
        sleeper.send_signal(signal.SIGSTOP)
        for _ in range(100):
            if _stopped(sleeper.pid):
                break
            time.sleep(0.05)
        assert _stopped(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not _stopped(sleeper.pid)  # gone: cannot tell, so not stopped


def test_a_frozen_probe_at_its_time_limit_is_the_machines_not_a_time_out():
    result = classify_exit(None, True, stopped=True)
    assert result.outcome is Outcome.CRASH and result.fault == INFRASTRUCTURE and result.cause == "stopped"
    assert classify_exit(None, True).outcome is Outcome.TIMEOUT  # a running probe out of time stays the candidate's


class FrozenOnce(FormulaRunner):
    """The first probe is frozen until its time runs out; every later one runs."""

    def run(self, candidate, steps, **plan):
        if not getattr(self, "frozen", False):
            self.frozen = True
            self.calls.append(candidate)
            return classify_exit(None, True, stopped=True)
        return super().run(candidate, steps, **plan)


def test_a_frozen_probe_runs_once_more_with_a_note_and_the_answer_stays(tmp_path):
    def search(folder, runner_class):
        spec = spec_of(model="tiny-qwen2", budget_bytes=350 * MiB, out_dir=folder, max_length=512, device="cpu",
                       predict=False, verify_steps=10)
        return Search(spec, runner_class(spec.budget_bytes), resolve_ladder(None)).run()

    clean = search(tmp_path / "clean", FormulaRunner)
    frozen = search(tmp_path / "frozen", FrozenOnce)
    assert frozen.chosen.candidate.key() == clean.chosen.candidate.key()
    assert any("stopped" in note and "ran once more" in note for note in frozen.notes)


@pytest.mark.slow
def test_a_real_probe_that_freezes_itself_is_reported_frozen(tmp_path):
    # The time limit counts from the fork (the probe server's preload is over by then) and the factory stops itself
    # first thing: 20 s is several times what reaching it takes under load, and the test waits all of it.
    runner = ProcessRunner("probe_factories:stops_itself", 2**30, tmp_path, timeout_s=20)
    result = runner.run(Candidate("sft", "tiny-qwen2", "cpu", micro_batch=1, grad_accum=1, max_length=16), 2)
    assert result.outcome is Outcome.CRASH and result.cause == "stopped", result
