"""What a search trusts (issue 30, its wrong answers): a stored probe of another configuration of the model is
measured again, a probe the machine failed is run once more and the notes say so, and "nothing fits" is never
answered from failures that are not memory."""

import json
import shutil

import pytest
from fakes import FormulaRunner, MiB, formula_spec

from autofit.core import INFRASTRUCTURE, Outcome, ProbeResult
from autofit.machine._registry import BUNDLED_DIR
from autofit.rungs import resolve_ladder
from autofit.search import InfrastructureError, Search, check_no_fit_is_an_answer
from autofit.search._result import Record

MACHINE_CRASH = ProbeResult(Outcome.CRASH, error="probe exited with code 255 without a result", fault=INFRASTRUCTURE,
                            cause="exit")


def search(spec, runner):
    return Search(spec, runner, resolve_ladder(spec.ladder)).run()


def test_a_probe_the_machine_failed_runs_once_more_and_the_notes_say_so(tmp_path):
    spec = formula_spec(tmp_path / "out", 800 * MiB)
    crashed = []

    def once(candidate, steps):
        if not crashed:
            crashed.append(candidate.key())
            return MACHINE_CRASH
        return None

    runner = FormulaRunner(spec.budget_bytes, fail_if=once)
    report = search(spec, runner)
    untroubled = search(formula_spec(tmp_path / "again", 800 * MiB), FormulaRunner(spec.budget_bytes))
    assert report.fits and report.chosen.candidate.key() == untroubled.chosen.candidate.key()  # the same answer
    assert sum(c.key() == crashed[0] for c in runner.candidates) == 2  # failed by the machine, run again
    assert any("not the candidate's (probe exited with code 255" in note and "ran once more and " in note
               for note in report.notes)


def test_a_crash_that_is_not_the_machines_is_not_run_again(tmp_path):
    spec = formula_spec(tmp_path, 800 * MiB)
    first = []

    def once(candidate, steps):
        if not first:
            first.append(candidate.key())
            return Outcome.CRASH  # the fake's own crash: no infrastructure fault
        return None

    runner = FormulaRunner(spec.budget_bytes, fail_if=once)
    search(spec, runner)
    assert sum(c.key() == first[0] for c in runner.candidates) == 1


def test_nothing_fits_is_not_an_answer_when_probes_only_crashed(tmp_path):
    # --max-probes 1 and a probe that cannot run (a read-only HOME, a killed probe): no out-of-memory was seen, so
    # no rung list can be claimed; the search stops as "probes cannot run here" (exit 4), not "nothing fits".
    spec = formula_spec(tmp_path, 800 * MiB, max_probes=1)
    runner = FormulaRunner(spec.budget_bytes, fail_if=lambda c, s: MACHINE_CRASH)
    with pytest.raises(InfrastructureError, match="no probe ran out of memory"):
        search(spec, runner)
    # even where the memory model ruled the other candidates out
    crashed = Record(0, runner.candidates[0], "probe", MACHINE_CRASH, False, None, None)
    with pytest.raises(InfrastructureError):
        check_no_fit_is_an_answer([crashed], skipped=True)
    oom = Record(0, runner.candidates[0], "probe", ProbeResult(Outcome.OOM, peak_bytes=1), False, None, None)
    check_no_fit_is_an_answer([crashed, oom], skipped=True)  # an out-of-memory is an answer


def test_a_search_stopped_by_max_probes_does_not_claim_the_rungs_it_never_tried(tmp_path):
    # one probe, out of memory, and --max-probes 1: "nothing fits even with ... quant-4bit" would be a claim about
    # rungs never probed; the message says where the search stopped, what it did not try, and that it resumes
    from autofit._api import no_fit_message

    spec = formula_spec(tmp_path, 10 * MiB, max_probes=1)
    report = search(spec, FormulaRunner(spec.budget_bytes))
    assert not report.fits and report.probe_limit_reached
    message = no_fit_message(report)
    assert message.startswith("nothing fitted in 10.00 MiB within --max-probes 1: the search stopped at ")
    assert "not tried: " in message and "quant-4bit" in message.split("not tried: ")[1]
    assert "nothing fits" not in message and message.endswith("it resumes from what was measured.")


def test_stored_probes_of_another_configuration_of_the_model_are_measured_again(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    config = json.loads((BUNDLED_DIR / "tiny-qwen2.json").read_text())
    (folder / "config.json").write_text(json.dumps(config))
    spec = formula_spec(tmp_path / "out", 800 * MiB, model=str(folder))
    first = search(spec, FormulaRunner(spec.budget_bytes))
    again_runner = FormulaRunner(spec.budget_bytes)
    again = search(spec, again_runner)
    assert first.probes_run > 0 and again.probes_run == 0  # the same model: every probe reused
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] + 1}))
    edited_runner = FormulaRunner(spec.budget_bytes)
    edited = search(spec, edited_runner)
    assert edited.probes_run == first.probes_run and edited_runner.probes(steps=2)  # measured again, all of them
    assert any("measured on another configuration of the model" in note for note in edited.notes)
    shutil.rmtree(folder)


def test_a_probe_run_once_more_says_so_in_its_start_line(tmp_path, caplog):
    # issue 61: the 7B probe killed by the host (SIGKILL) was run once more under the same number, and its
    # "probe 1 ... started" line came twice, identical, with nothing in between to say why
    import logging

    from autofit.probe import LineProgress

    spec = formula_spec(tmp_path / "out", 800 * MiB)
    killed = ProbeResult(Outcome.CRASH, error="probe killed by signal SIGKILL (host memory exhausted?)",
                         fault=INFRASTRUCTURE, cause="signal")
    crashed = []

    def once(candidate, steps):
        if not crashed:
            crashed.append(candidate.key())
            return killed
        return None

    with caplog.at_level(logging.INFO, logger="autofit"):
        Search(spec, FormulaRunner(spec.budget_bytes, fail_if=once), resolve_ladder(spec.ladder),
               progress=LineProgress()).run()
    lines = [r.getMessage() for r in caplog.records]
    first = [line for line in lines if line.startswith("probe 1 ")]
    started = [line for line in first if ": started" in line]
    assert len(started) == 2 and len(set(started)) == 2, first  # not the same line twice
    assert ": started again" in started[1]
    between = first[first.index(started[0]) + 1:first.index(started[1])]
    assert any("SIGKILL" in line and "once more" in line for line in between), first
