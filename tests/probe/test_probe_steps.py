"""A rung's probe step: the built-in rungs' steps, how the probe's child finds a ladder's steps, and the hooks'
order (autofit.probe._steps, autofit.rungs.ProbeStep)."""

from __future__ import annotations

import os

import pytest

from autofit.core import INFRASTRUCTURE, Candidate, Outcome, ProbeResult, ProbeSettings
from autofit.probe import ProcessRunner
from autofit.probe import _steps as steps
from autofit.rungs import DEFAULT_LADDER, RungBase, probe_steps
from autofit.rungs._failures import ENGINE_FAILURE
from autofit.rungs.engines import ZERO2_OFFLOAD
from autofit.rungs.liger import KERNEL_FAILURE

CUSTOM = "custom_steps:RecordingStep"


def candidate(**changes) -> Candidate:
    fields = dict(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=1, grad_accum=1, max_length=32)
    fields.update(changes)
    return Candidate(**fields)


def names(found):
    return [type(step).__name__ for step in found]


def test_the_built_in_rungs_name_their_steps_and_every_probe_considers_them():
    named = dict(probe_steps(DEFAULT_LADDER))
    assert named["liger-kernels"] == "autofit.rungs.liger._probe:LigerStep"
    assert named["activation-offload"] == "autofit.rungs.activation_offload._probe:ActivationOffloadStep"
    assert named["optimizer-offload"] == named["zero3"] == named["fsdp2"] == "autofit.rungs.engines._probe:EngineStep"
    considered = steps.considered(candidate())
    assert names(considered) == ["LigerStep", "VllmStep", "EngineStep", "ActivationOffloadStep", "OwnDeepSpeedStep"]
    assert {"optimizer-offload", "zero1", "fsdp2-offload"} <= considered[2].rungs


@pytest.mark.parametrize("changes, active", [
    ({}, []),
    ({"liger": True}, ["LigerStep"]),  # a field set without the rung's name (a user's own config): still its step
    ({"offload": ZERO2_OFFLOAD, "activation_offload": True}, ["EngineStep", "ActivationOffloadStep"]),
    ({"ranks": 2}, ["EngineStep"]),  # data parallel: an engine of no rung's
    ({"user_args": (("deepspeed", "ds.json"),)}, ["OwnDeepSpeedStep"]),
    ({"user_args": (("deepspeed", "ds.json"),), "offload": ZERO2_OFFLOAD}, ["EngineStep"]),
])
def test_a_step_is_active_by_the_candidates_fields(changes, active):
    c = candidate(**changes)
    assert names(step for step in steps.considered(c) if step.active(c)) == active


def test_a_failure_is_the_engines_before_the_kernels():
    c = candidate(offload=ZERO2_OFFLOAD, liger=True)
    active = [step for step in steps.considered(c) if step.active(c)]
    assert steps.claimed(active, c, Outcome.CRASH, "", "error") == (Outcome.INVALID, ENGINE_FAILURE)
    assert steps.claimed(active, c, Outcome.INVALID, "", "rejected") == (Outcome.INVALID, KERNEL_FAILURE)
    assert steps.claimed(active, c, Outcome.CRASH, INFRASTRUCTURE, "disk") == (Outcome.CRASH, "disk")
    assert steps.claimed([], c, Outcome.OOM, "", "oom") == (Outcome.OOM, "oom")


def test_a_step_that_cannot_be_loaded_is_named():
    with pytest.raises(ImportError, match="'no_such_module:Step' cannot be imported: ModuleNotFoundError"):
        steps.load("no_such_module:Step")
    with pytest.raises(ImportError, match="'custom_steps:Missing' cannot be imported: AttributeError"):
        steps.load("custom_steps:Missing")
    with pytest.raises(TypeError, match="'custom_steps:NOT_A_STEP' is a object, not an autofit.rungs.ProbeStep"):
        steps.load("custom_steps:NOT_A_STEP")
    with pytest.raises(TypeError, match="MisspelledStep defines read_bak, which is no hook of ProbeStep"):
        steps.load("custom_steps:MisspelledStep")


def _broken(c):
    raise RuntimeError("the factory broke")


def _probe(tmp_path, monkeypatch, rung_steps, **changes):
    from autofit.probe._worker import run_probe

    monkeypatch.delenv("AUTOFIT_TEST_STEP", raising=False)
    probe = ProbeSettings(steps=1, output_dir=str(tmp_path), rung_steps=rung_steps)
    return run_probe(_broken, candidate(probe=probe, **changes), None)


def test_a_ladders_own_rung_acts_in_the_probe_through_its_step(tmp_path, monkeypatch):
    told = (("custom", CUSTOM), ("custom-too", CUSTOM))
    result = _probe(tmp_path, monkeypatch, told, rungs=("custom",))
    assert os.environ["AUTOFIT_TEST_STEP"] == "custom,custom-too"
    assert result.outcome is Outcome.INVALID and result.cause == "custom-rung", result.error

    result = _probe(tmp_path, monkeypatch, told)  # the candidate did not climb it
    assert "AUTOFIT_TEST_STEP" not in os.environ
    assert result.outcome is Outcome.CRASH and result.cause == "error"


def test_a_step_the_probe_cannot_import_is_one_line_naming_it(tmp_path, monkeypatch):
    result = _probe(tmp_path, monkeypatch, (("broken", "no_such_module:Step"),))
    assert result.outcome is Outcome.CRASH and result.fault == INFRASTRUCTURE and result.cause == "import"
    assert "the probe step 'no_such_module:Step' cannot be imported" in result.error and "\n" not in result.error


def test_the_runner_tells_the_probe_the_ladders_steps(tmp_path):
    class Custom(RungBase):
        name = "custom"
        probe_step = CUSTOM

    told = probe_steps([Custom(), *DEFAULT_LADDER])
    assert told[0] == ("custom", CUSTOM)
    runner = ProcessRunner("autofit.probe.algos.sft:build_trainer", None, tmp_path, rung_steps=told)
    seen = []
    runner._run_ranks = lambda c, folder: seen.append(c) or ProbeResult(Outcome.OK)  # type: ignore[method-assign]
    runner.run(candidate(ranks=2), 1)
    assert seen[0].probe.rung_steps == told
