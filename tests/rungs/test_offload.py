"""Optimizer offload (DeepSpeed ZeRO-2 through accelerate): the rung's rules, the engine's files and launch
environment, host memory on the simulated meter, the ledger, the export, and (slow) real probes under DeepSpeed."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
import yaml
from fakes import spec_of

import autofit.rungs._offload as offload_module
from autofit import memory_model as mm
from autofit.cli._estimate import estimate_text
from autofit.core import Candidate, LoraSettings, Outcome, ProbeResult, ProbeSettings, SearchSpec
from autofit.export import write as export_write
from autofit.probe._meters import SimulatedMeter
from autofit.rungs import RUNGS, LadderState, OptimizerOffload, climb, resolve_ladder
from autofit.rungs._failures import ENGINE_FAILURE
from autofit.rungs.engines import (
    ACCELERATE_YAML,
    DEEPSPEED_JSON,
    MARKER,
    ZERO2_OFFLOAD,
    deepspeed_missing,
    launch_env,
    remove_stale_engine_files,
    write_engine_files,
)
from autofit.search import Search
from autofit.search._host_memory import available_host_bytes, host_shortfalls

try:
    from fakes import FormulaRunner, MiB, formula_spec
except ImportError:  # tests/ became a package
    from tests.fakes import FormulaRunner, MiB, formula_spec

needs_deepspeed = pytest.mark.skipif(deepspeed_missing() is not None, reason="DeepSpeed is not installed")


def candidate(**changes) -> Candidate:
    fields = dict(algo="sft", model="tiny-qwen2", device="cuda", micro_batch=1, grad_accum=1, max_length=32)
    fields.update(changes)
    return Candidate(**fields)


def spec(out_dir, budget, **changes) -> SearchSpec:
    return formula_spec(out_dir, budget, **changes)


# -- the rung ---------------------------------------------------------------------------------------------------
def test_offload_applies_to_full_fine_tuning_only():
    rung = OptimizerOffload()
    applied = rung.apply(LadderState(candidate()))
    assert applied.candidate.offload == ZERO2_OFFLOAD and applied.cost == "speed"
    assert rung.apply(LadderState(candidate(lora=LoraSettings()))) is None
    assert rung.apply(LadderState(candidate(quantization="4bit"))) is None
    assert rung.apply(LadderState(candidate(algo="ppo"))) is None
    assert rung.apply(LadderState(candidate(optim="adamw_bnb_8bit"))) is None
    # the simulated device: only a ladder that names the rung probes it
    assert rung.apply(LadderState(candidate(device="cpu"))) is None
    assert RUNGS["optimizer-offload"].apply(LadderState(candidate(device="cpu"))).candidate.offload == ZERO2_OFFLOAD


def test_a_quality_rung_after_offload_takes_it_off():
    levels = climb(LadderState(candidate()), resolve_ladder(["optimizer-offload", "bf16-weights", "lora"]))
    assert [lvl.rungs for lvl in levels] == [(), ("optimizer-offload",), ("bf16-weights",), ("bf16-weights", "lora")]
    assert [lvl.candidate.offload for lvl in levels] == [None, ZERO2_OFFLOAD, None, None]
    assert levels[2].cost == "quality"


def test_without_deepspeed_the_rung_is_left_out_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(offload_module, "deepspeed_missing", lambda: "DeepSpeed is not installed (pip install x)")
    report = Search(spec(tmp_path, 10**12), FormulaRunner(10**12), resolve_ladder(None)).run()
    assert "rung optimizer-offload left out: DeepSpeed is not installed (pip install x)" in report.notes
    assert all("optimizer-offload" not in state.rungs for state in report.levels)


# -- the seed case, on the fake runner: a full fine-tune that fails only at the optimizer's states ----------------
@needs_deepspeed
def test_full_fine_tuning_kept_through_offload_not_lora(tmp_path):
    runner = FormulaRunner(0, weight_bytes=100 * MiB, act_bytes_per_token=1024)
    probe_spec = spec(tmp_path, 1, effective_batch=1, max_length=64)
    full = candidate(micro_batch=1, grad_accum=1, max_length=64, device="cuda")
    budget = runner.peak_bytes(full.replace(offload=ZERO2_OFFLOAD, env=(("PYTORCH_ALLOC_CONF", "x"),))) + MiB
    assert runner.peak_bytes(full) > budget  # the states do not fit
    runner.budget_bytes = budget
    report = Search(dataclasses.replace(probe_spec, budget_bytes=budget), runner, resolve_ladder(None)).run()
    chosen = report.chosen.candidate
    assert chosen.offload == ZERO2_OFFLOAD and chosen.lora is None and chosen.dtype is None and chosen.optim is None
    assert report.levels[report.chosen.level].cost == "speed"


def test_an_engine_that_cannot_run_leaves_its_rung_after_one_probe(tmp_path):
    """DeepSpeed failing to build or start (on a GPU box: its CPU Adam without the CUDA headers) is the rung's
    failure: one probe, a note, and the search answers with the next rungs instead of stopping."""
    runner = FormulaRunner(0, weight_bytes=100 * MiB, act_bytes_per_token=1024)
    runner.fail_if = lambda c, steps: ProbeResult(Outcome.INVALID, steps=steps, error="RuntimeError: Error building "
                                                  "extension 'cpu_adam'", cause=ENGINE_FAILURE) if c.offload else None
    full = candidate(micro_batch=1, grad_accum=8, max_length=64, checkpointing=True)
    runner.budget_bytes = runner.peak_bytes(full) - MiB  # too much for plain AdamW; offload or bf16 would fit
    report = Search(spec(tmp_path, runner.budget_bytes, max_length=64), runner, resolve_ladder(None)).run()
    assert len([c for c in runner.candidates if c.offload]) == 1
    assert any(n.startswith("optimizer offload could not run here (RuntimeError: Error building") for n in report.notes)
    assert report.chosen.candidate.offload is None and report.chosen.candidate.dtype == "bfloat16"


@needs_deepspeed
def test_a_failure_under_the_engine_is_the_rungs_not_the_machines(tmp_path):
    from autofit.probe._worker import run_probe

    def broken(candidate):
        raise RuntimeError("Error building extension 'cpu_adam'")

    saved = dict(os.environ)  # the probe takes accelerate's launch environment: not this test process's to keep
    try:
        result = run_probe(broken, candidate(device="cpu", offload=ZERO2_OFFLOAD,
                                             probe=ProbeSettings(steps=1, output_dir=str(tmp_path))), None)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert result.outcome is Outcome.INVALID and result.cause == ENGINE_FAILURE
    assert "Error building extension" in result.error


# -- host memory ------------------------------------------------------------------------------------------------
@needs_deepspeed
def test_host_shortfall_leaves_the_rung_out(tmp_path, monkeypatch):
    start = LadderState(candidate())
    rungs = resolve_ladder(["optimizer-offload", "lora"])
    shape = mm.ModelShape.from_model("tiny-qwen2")
    need = mm.host_bytes(candidate(offload=ZERO2_OFFLOAD), shape, "cuda")  # effective batch 1: no accumulation
    assert host_shortfalls(start, rungs, shape, "cuda", available=int(need)) == []
    [(rung, note)] = host_shortfalls(start, rungs, shape, "cuda", available=int(need) - 1)
    assert rung == "optimizer-offload" and note.startswith("rung optimizer-offload left out: its offloaded states need")
    # an effective batch of 8 may be split into micro-batches: the fp32 accumulation buffer is counted
    split = mm.host_bytes(candidate(offload=ZERO2_OFFLOAD, micro_batch=4, grad_accum=2), shape, "cuda")
    assert split == need + 4 * mm.param_counts(shape).total
    assert host_shortfalls(LadderState(candidate(micro_batch=8)), rungs, shape, "cuda", available=int(need))
    assert host_shortfalls(start, resolve_ladder(["lora"]), shape, "cuda", available=1) == []

    monkeypatch.setattr("autofit.search._host_memory.available_host_bytes", lambda: 1)
    report = Search(spec(tmp_path, 10**12), FormulaRunner(10**12), rungs).run()
    assert any(n.startswith("rung optimizer-offload left out: its offloaded states need") for n in report.notes)
    assert all(state.candidate.offload is None for state in report.levels)


def test_available_host_bytes_reads_memavailable(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   1000 kB\n")
    assert available_host_bytes(str(meminfo)) == 1000 * 1024
    assert available_host_bytes(str(tmp_path / "missing")) is None
    assert available_host_bytes() > 0  # this machine's


# -- the ledger ---------------------------------------------------------------------------------------------------
def test_ledger_moves_states_to_the_host():
    shape = mm.ModelShape.from_model("tiny-qwen2")
    plain, off = candidate(), candidate(offload=ZERO2_OFFLOAD)
    total = mm.param_counts(shape).total
    ledgers = {ledger.phase: ledger for ledger in mm.phase_ledgers(off, shape)}
    assert set(ledgers) == {"train", "backward", "step", "engine_setup"}
    assert all(ledger.optimizer == 0 for ledger in ledgers.values())
    assert ledgers["step"].weights == total * 2  # DeepSpeed trains the device copy in bf16 on CUDA
    assert mm.predict(off, shape).total < mm.predict(plain, shape).total
    largest = max(t.numel for t in mm.trainable_tensors(shape, off))
    assert ledgers["step"].host == total * (16 + 2) + largest * 4
    assert mm.host_bytes(off.replace(grad_accum=2), shape, "cuda") == ledgers["step"].host + total * 4
    assert mm.host_bytes(plain, shape, "cuda") == 0


@needs_deepspeed
def test_estimate_shows_host_memory_of_the_offload_level():
    text = estimate_text(spec_of(model="meta-llama/Llama-3.1-8B", algo="sft", device="cuda",
                                    budget_bytes=80 * 10**9, max_length=128, effective_batch=1))
    header = next(line for line in text.splitlines() if line.startswith("lvl"))
    row = next(line for line in text.splitlines() if "+optimizer-offload" in line and line.split()[0].isdigit())
    assert header.split()[-1] == "host" and float(row.split()[-1]) > 100  # GiB: 16 B/param and more for 8B
    assert "host: host memory (pinned RAM)" in text


# -- the simulated meter ----------------------------------------------------------------------------------------
def test_host_aware_meter_replays_peaks_without_host_storages():
    meter = SimulatedMeter(budget_bytes=3000, host_aware=True)
    with meter:
        meter.set_phase("train_setup")
        host = torch.zeros(500)  # 2000 bytes: the engine's host state
        device = torch.zeros(250)  # 1000 bytes
        meter.set_phase("forward_backward")
        transient = torch.ones(400)  # 1600 bytes: over the budget only if the host state counted
        del transient
    assert meter.peaks()["forward_backward"] == 3000 + 1600  # nothing is known to be host yet
    meter.set_host([host])
    assert meter.host_bytes == 2000
    peaks = meter.peaks()
    assert peaks["train_setup"] == 1000 and peaks["forward_backward"] == 2600
    meter.check_budget()  # 2600 <= 3000
    meter.budget_bytes = 2500
    with pytest.raises(torch.OutOfMemoryError, match="2000 bytes|1.95 KiB|0.00 MiB of offloaded state"):
        meter.check_budget()
    assert meter.phase == "forward_backward"
    del device


# -- the engine's files and launch ---------------------------------------------------------------------------
@needs_deepspeed
def test_engine_files_are_what_accelerate_launch_reads(tmp_path):
    files = write_engine_files(tmp_path / "out", ZERO2_OFFLOAD)
    ds = json.loads(files["deepspeed"].read_text())
    assert ds["zero_optimization"]["stage"] == 2 and ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "zero_force_ds_cpu_optimizer" not in ds  # on a GPU: DeepSpeed's CPU Adam
    simulated = json.loads(write_engine_files(tmp_path / "cpu", ZERO2_OFFLOAD, "cpu")["deepspeed"].read_text())
    assert simulated["zero_force_ds_cpu_optimizer"] is False  # torch's AdamW on the host partition
    accelerate = yaml.safe_load(files["accelerate"].read_text())
    assert accelerate["distributed_type"] == "DEEPSPEED" and accelerate["num_processes"] == 1
    assert accelerate["deepspeed_config"]["deepspeed_config_file"] == str(files["deepspeed"])
    env = launch_env(files["accelerate"], "cpu")  # accelerate's own launch code reads the file
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(files["deepspeed"])
    assert env["WORLD_SIZE"] == "1" and int(env["MASTER_PORT"]) > 0
    assert env["DS_ACCELERATOR"] == "cpu" and env["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(ValueError, match="unknown engine 'zero9': accepted are zero2-offload"):
        write_engine_files(tmp_path, "zero9")


def test_stale_engine_files_removed_only_when_autofit_wrote_them(tmp_path):
    write_engine_files(tmp_path, ZERO2_OFFLOAD)
    remove_stale_engine_files(tmp_path)
    assert not (tmp_path / ACCELERATE_YAML).exists() and not (tmp_path / DEEPSPEED_JSON).exists()
    (tmp_path / ACCELERATE_YAML).write_text("distributed_type: MULTI_GPU\n")  # the user's own
    remove_stale_engine_files(tmp_path)
    assert (tmp_path / ACCELERATE_YAML).read_text() == "distributed_type: MULTI_GPU\n"


@needs_deepspeed
def test_export_writes_the_engine_beside_best_yaml(tmp_path):
    runner = FormulaRunner(0, weight_bytes=100 * MiB, act_bytes_per_token=1024)
    base = spec(tmp_path, 1, effective_batch=1, max_length=64, ladder=["optimizer-offload", "lora"])
    runner.budget_bytes = 150 * MiB
    report = Search(dataclasses.replace(base, budget_bytes=runner.budget_bytes), runner,
                    resolve_ladder(base.ladder)).run()
    paths = export_write(report, tmp_path)
    assert report.chosen.candidate.offload == ZERO2_OFFLOAD
    assert (tmp_path / ACCELERATE_YAML).read_text().startswith(MARKER)
    best_yaml = paths["yaml"].read_text()
    assert "# use: trl sft --config best.yaml --accelerate_config accelerate.yaml" in best_yaml
    data = json.loads(paths["json"].read_text())
    assert any(t.startswith("optimizer offload (DeepSpeed ZeRO-2)") for t in data["trades"])
    engine = data["engine"]
    assert engine["launch"] == (f"trl sft --config {tmp_path.resolve() / 'best.yaml'} --accelerate_config "
                                f"{tmp_path.resolve() / ACCELERATE_YAML}")
    assert engine["host_bytes_predicted"] > 0

    # an answer without offload takes autofit's engine files away (a stale one would launch the wrong engine)
    runner.budget_bytes = 10**12
    again = dataclasses.replace(base, gpu_bytes=runner.budget_bytes, budget_bytes=runner.budget_bytes,
                                options=dataclasses.replace(base.options, out_dir=tmp_path / "again"))
    report = Search(again, runner, resolve_ladder(base.ladder)).run()
    export_write(report, tmp_path)
    assert report.chosen.candidate.offload is None and not (tmp_path / ACCELERATE_YAML).exists()
    assert json.loads((tmp_path / "best.json").read_text())["engine"] is None


# -- real probes under DeepSpeed on the CPU meter -----------------------------------------------------------------
@pytest.mark.slow
@needs_deepspeed
def test_seed_case_keeps_full_fine_tuning_through_offload(tmp_path):
    """A full fine-tune that fits until the optimizer's first step: DeepSpeed's offload keeps it full, the
    bf16-weights and LoRA rungs after it are not needed, and the host memory is what the ledger says."""
    from autofit._api import fit

    result = fit("autofit.probe.algos.sft:build_trainer", model="tiny-qwen2", algo="sft", device="cpu",
                 gpu_memory="70MiB", max_length=32, effective_batch=1,
                 ladder=["optimizer-offload", "bf16-weights", "lora"], verify_steps=3, out_dir=tmp_path)
    report = result.report
    baseline = report.records[0]
    assert baseline.result.outcome.value == "OOM" and baseline.result.error_phase == "optimizer_step"
    chosen = report.chosen.candidate
    assert chosen.offload == ZERO2_OFFLOAD and chosen.lora is None and chosen.dtype is None
    assert report.verified.peak_bytes <= 70 * MiB
    engine = json.loads((tmp_path / "best.json").read_text())["engine"]
    assert engine["host_bytes"] == pytest.approx(engine["host_bytes_predicted"], rel=0.01)
    predicted = mm.predict(chosen.replace(rungs=()), mm.ModelShape.from_model("tiny-qwen2")).total
    assert report.chosen.result.peak_bytes == pytest.approx(predicted, rel=0.05)
    env = launch_env(tmp_path / ACCELERATE_YAML, "cpu")
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str((tmp_path / DEEPSPEED_JSON).resolve())
