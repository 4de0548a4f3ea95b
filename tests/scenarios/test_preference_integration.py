"""DPO and KTO (issue 47), searched through the user's doors with TRL's DPOTrainer and KTOTrainer on the CPU meter:
a ``trl dpo`` config file comes back with only what fitting changed, commented, a file TRL's dpo command reads; a KTO
search by ``--model`` writes a file TRL's kto command reads; the memory model predicts both within 5% of the probes.
The ledger's reading of their units is tests/memory_model/test_preference_ledger.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from autofit.launch import read_trl_file

pytestmark = pytest.mark.slow

DPO_FILE = """model_name_or_path: tiny-qwen2
max_length: 64
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
beta: 0.1
learning_rate: 5.0e-7  # the user's own, kept as written
"""


def _search(out, *args) -> dict:
    done = subprocess.run([sys.executable, "-m", "autofit.cli", "search", "--device", "cpu", "--verify-steps", "2",
                           "--out", str(out), *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "best.json").read_text())


def _predicted_within(best: dict, share: float) -> None:
    for record in best["candidates"]:
        if record["outcome"] == "OK" and record["prior_predicted_bytes"]:
            error = abs(record["prior_predicted_bytes"] - record["peak_bytes"]) / record["peak_bytes"]
            assert error < share, (record["candidate"], error)


def test_a_dpo_file_comes_back_with_what_fitting_changed(tmp_path):
    """The reference model (a copy of the policy, reloaded from its path) does not fit beside the trainer at 270 MiB:
    the search precomputes its log-probs (no reference held), and best.yaml is the user's file with that change."""
    config = tmp_path / "dpo.yaml"
    config.write_text(DPO_FILE)
    best = _search(tmp_path / "out", "--gpu-memory", "270MiB", "--", "trl", "dpo", "--config", str(config))
    assert best["algo"] == "dpo" and "precompute-ref" in best["rungs"]
    assert best["config"]["precompute_ref_log_probs"] is True
    assert {change["key"] for change in best["changes"]} >= {"precompute_ref_log_probs"}
    text = (tmp_path / "out" / "best.yaml").read_text()
    assert "learning_rate: 5.0e-7  # the user's own, kept as written" in text
    assert re.search(r"precompute_ref_log_probs: true +# autofit: added \(TRL default False\); precompute-ref", text)
    parsed = read_trl_file(str(tmp_path / "out" / "best.yaml"), "dpo")  # TRL's dpo command reads it
    assert parsed.training["precompute_ref_log_probs"] is True and parsed.training["beta"] == 0.1
    _predicted_within(best, 0.05)


def test_a_kto_search_writes_a_file_trls_kto_command_reads(tmp_path):
    best = _search(tmp_path, "--model", "tiny-qwen2", "--algo", "kto", "--gpu-memory", "400MiB", "--max-length", "64",
                   "--effective-batch", "4")
    assert best["algo"] == "kto" and best["fits"]
    parsed = read_trl_file(str(tmp_path / "best.yaml"), "kto")
    assert parsed.training["max_length"] == 64 and parsed.training["per_device_train_batch_size"] == 4
    _predicted_within(best, 0.05)
