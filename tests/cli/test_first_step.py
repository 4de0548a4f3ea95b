"""The first step as a phase (issue 59, item 4): for GRPO, RLOO and PPO the estimate says the peak of step 1, before
the optimizer's states exist (torch's and bitsandbytes' Adam create them at the first ``step()``; ZeRO holds its
master weights from setup), against every later step's, and which step runs out of memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import at_door_values

from autofit import cli
from autofit.core import SearchOptions
from autofit.memory_model import base_candidate, phase_ledgers, step_peaks
from autofit.memory_model._first_step import first_step_ledgers
from autofit.memory_model._ledger import ZERO_MASTER_SHARE
from autofit.search import estimate_question

MiB = 2**20
GRPO = """model_name_or_path: Qwen/Qwen2.5-0.5B
num_generations: 4
max_completion_length: 512
per_device_train_batch_size: 8
gradient_checkpointing: false
"""
ZERO2 = "bf16: true\ndeepspeed:\n  zero_optimization:\n    stage: 2\n"


def _run(tmp_path: Path, text: str, **given):
    path = tmp_path / "grpo.yaml"
    path.write_text(text, encoding="utf-8")
    spec = estimate_question(SearchOptions(**at_door_values({"config": str(path), "algo": "grpo",
                                                             "gpu_memory": "H100", "device": "cuda", **given})))
    candidate = base_candidate(spec)
    return str(path), candidate, phase_ledgers(candidate, device=spec.device)


def test_before_the_first_step_no_phase_holds_the_optimizers_states(tmp_path):
    _, candidate, ledgers = _run(tmp_path, GRPO)
    first = {ledger.phase: ledger for ledger in first_step_ledgers(ledgers, candidate)}
    steady = {ledger.phase: ledger for ledger in ledgers}
    assert set(first) == set(steady) == {"generation", "train", "backward", "step"}
    for phase in ("generation", "train", "backward"):
        assert steady[phase].optimizer > 0 and first[phase].optimizer == 0
        assert first[phase].total == pytest.approx(
            steady[phase].total - steady[phase].optimizer * steady[phase].reserved_factor)
        assert first[phase].allocator <= steady[phase].allocator
    assert first["step"] == steady["step"]  # the first step's optimizer step creates the states


def test_zero_holds_its_master_weights_from_setup(tmp_path):
    _, candidate, ledgers = _run(tmp_path, GRPO + ZERO2, gpus=2)
    first = {ledger.phase: ledger for ledger in first_step_ledgers(ledgers, candidate)}
    steady = {ledger.phase: ledger for ledger in ledgers}
    assert "backward" not in first and first["first_backward"] == steady["first_backward"]
    assert first["train"].optimizer == pytest.approx(steady["train"].optimizer * ZERO_MASTER_SHARE)
    assert "first_backward" not in {ledger.phase for ledger in [step_peaks(ledgers, candidate).steady]}


def _level_zero_line(capsys, path: str, budget_mib: int) -> str:
    assert cli.main(["estimate", "--config", path, "--algo", "grpo", "--gpu-memory", f"{budget_mib}MiB"]) == 0
    out = capsys.readouterr().out
    return next(line for line in out.splitlines() if line.startswith("level 0 (the run as asked): step 1 peaks"))


def test_the_estimate_says_which_step_runs_out_of_memory(tmp_path, capsys):
    path, candidate, ledgers = _run(tmp_path, GRPO)
    peaks = step_peaks(ledgers, candidate)
    first, steady = peaks.first.total / MiB, peaks.steady.total / MiB
    assert first < steady - 100  # this run is the one users report: its states push a later step over
    between = int((first + steady) / 2)
    line = _level_zero_line(capsys, path, between)
    assert peaks.steady.phase == "train" and "step 2 runs out of memory at its forward + LM head" in line
    assert "step 1 runs in" in line
    assert "out of memory at step 1's" in _level_zero_line(capsys, path, int(first) - 50)
    assert "both within" in _level_zero_line(capsys, path, int(steady) + 50)
