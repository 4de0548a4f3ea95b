"""``autofit estimate --config FILE`` prints the user's run at each phase of its step by term (issue 39, item 4): the
figures are the memory model's own ledgers of those phases (``phase_ledgers``), PyTorch's allocated peak and what
nvidia-smi shows, the second above the first by the modelled allocator reserve and CUDA context."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List

import pytest
from fakes import at_door_values

from autofit import cli
from autofit.core import SearchOptions
from autofit.memory_model import TERMS, Ledger, base_candidate, phase_ledgers
from autofit.search import estimate_question

GiB = 2**30
CONTEXT = GiB // 2  # the CUDA context the ledger counts on one GPU (memory-facts 2.7)
SFT = """model_name_or_path: Qwen/Qwen2.5-7B
max_length: 1024
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
gradient_checkpointing: true
"""
ZERO2 = "bf16: true\ndeepspeed:\n  zero_optimization:\n    stage: 2\n"
GRPO = """model_name_or_path: Qwen/Qwen2.5-0.5B
num_generations: 4
max_completion_length: 256
per_device_train_batch_size: 8
"""
COLUMNS = {"weights": "weights", "grads": "gradients", "optim": "optimizer", "activ": "activations",
           "logits": "logits", "gen": "generation", "ref": "reference"}


def _ledgers(path: str, **given) -> List[Ledger]:
    """The memory model's own ledgers of the file's run, one per phase."""
    spec = estimate_question(SearchOptions(**at_door_values({"config": path, **given})))
    return phase_ledgers(base_candidate(spec), device=spec.device)


def _printed(capsys, *argv: str) -> Dict[str, Dict[str, str]]:
    """The "your run at each phase" table: phase label -> column -> cell."""
    assert cli.main(["estimate", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("your run at each phase"))
    header = re.split(r"\s{2,}", lines[start + 1].strip())
    table = {}
    for line in lines[start + 2:]:
        if not line.startswith("  "):
            break
        cells = re.split(r"\s{2,}", line.strip())
        table[cells[0]] = dict(zip(header, cells, strict=False))
    return table


def _json_phases(capsys, *argv: str) -> Dict[str, dict]:
    assert cli.main(["estimate", *argv, "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["estimates"][0]["your_run"]
    return {phase["phase"]: phase for phase in run["phases"]}


@pytest.mark.parametrize("engine, gpus, algo", [("", 1, "sft"), (ZERO2, 1, "sft"), ("", 4, "sft"),
                                                ("", 1, "grpo")],
                         ids=["sft", "zero2", "ddp-4-gpus", "grpo"])
def test_each_phase_printed_is_the_ledgers_terms(tmp_path: Path, capsys, engine, gpus, algo):
    path = tmp_path / f"{algo}.yaml"
    path.write_text((GRPO if algo == "grpo" else SFT) + engine, encoding="utf-8")
    argv = ["--config", str(path), "--algo", algo, "--gpu-memory", "H100", "--gpus", str(gpus)]
    ledgers = _ledgers(str(path), algo=algo, gpu_memory="H100", gpus=gpus, device="cuda")
    printed, phases = _printed(capsys, *argv), _json_phases(capsys, *argv)
    assert set(phases) == {ledger.phase for ledger in ledgers}
    assert len(printed) == len(ledgers)
    expected_phases = {"train", "backward", "step"} | ({"first_backward"} if engine else set()) | (
        {"generation"} if algo == "grpo" else set())
    assert set(phases) == expected_phases
    peak = max(ledgers, key=lambda ledger: ledger.total)
    for ledger in ledgers:
        shown = phases[ledger.phase]
        for term in TERMS:
            if term in ("allocator", "cuda_context"):
                continue
            assert shown["terms"][term]["bytes"] == round(getattr(ledger, term)), (ledger.phase, term)
        assert shown["pytorch"]["bytes"] == round(ledger.allocated)
        assert shown["nvidia_smi"]["bytes"] == round(ledger.total)
        assert shown["peak"] == (ledger.phase == peak.phase)
        row = printed[shown["label"]]
        for header, term in COLUMNS.items():
            assert row[header] == f"{getattr(ledger, term) / GiB:.2f}", (ledger.phase, header)
        assert row["PyTorch"] == f"{ledger.allocated / GiB:.2f}" and row["nvidia-smi"] == f"{ledger.total / GiB:.2f}"
        # nvidia-smi = PyTorch's allocated peak + the caching allocator's reserve (rho - 1 of it) + the context
        torch_bytes, smi = ledger.allocated, ledger.total
        assert ledger.reserved_factor > 1
        assert smi - torch_bytes == pytest.approx((ledger.reserved_factor - 1) * torch_bytes + ledger.cuda_context)
        assert shown["allocator"]["bytes"] == round((ledger.reserved_factor - 1) * torch_bytes)
        if gpus == 1:
            assert ledger.cuda_context == CONTEXT
        else:  # NCCL's buffers, outside PyTorch's allocator, beside the context
            assert ledger.cuda_context > CONTEXT


def test_a_calibrated_estimate_prints_the_phases_its_level_was_predicted_with(tmp_path: Path, capsys):
    """With --from, the phases are scaled as the level's peak is: the peak phase's figure is the level's peak."""
    from autofit.core import Candidate
    from autofit.memory_model import calibrate, predict

    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: tiny-qwen2\nmax_length: 128\nper_device_train_batch_size: 4\n"
                    "gradient_accumulation_steps: 2\n", encoding="utf-8")
    points = [Candidate(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=m, grad_accum=1, max_length=128)
              for m in (1, 8)]
    measured = [(c, predict(c).static * 1.1 + predict(c).dynamic * 0.9) for c in points]
    (tmp_path / "best.json").write_text(json.dumps({"memory_model": calibrate(measured).to_dict()}))
    argv = ["--config", str(path), "--device", "cpu", "--gpu-memory", "300MiB", "--from", str(tmp_path)]
    assert cli.main(["estimate", *argv, "--json"]) == 0
    card = json.loads(capsys.readouterr().out)["estimates"][0]
    assert card["memory_model"]["calibrated"]
    run = card["your_run"]
    peak = next(phase for phase in run["phases"] if phase["peak"])
    assert peak["nvidia_smi"] == run["peak"] == card["levels"][0]["peak"]
    for phase in run["phases"]:  # the CPU meter counts live tensors: nothing beside them
        assert phase["pytorch"] == phase["nvidia_smi"] and phase["cuda_context"]["bytes"] == 0
        assert phase["nvidia_smi"] == run["phase_totals"][phase["phase"]]
    uncalibrated = {ledger.phase: ledger.total for ledger in _ledgers(str(path), device="cpu", gpu_memory="300MiB")}
    assert {name: phase["nvidia_smi"]["bytes"] for name, phase in
            ((p["phase"], p) for p in run["phases"])} != {name: round(total) for name, total in uncalibrated.items()}
