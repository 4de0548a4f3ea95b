"""Real TRL PPOTrainer probes. PPO exists only in TRL 0.29-1.12: `make test-ppo` runs these with trl 1.12
overlaid on the environment (PYTHONPATH); on a newer TRL they are skipped and `--algo ppo` must exit 2."""

import json

import pytest

from autofit import cli
from autofit.core import Candidate, LoraSettings, Outcome
from autofit.core._algorithms import ppo_available
from autofit.probe import ProcessRunner

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ppo,
    pytest.mark.skipif(not ppo_available(), reason="this TRL has no PPOTrainer (run `make test-ppo`)"),
]

PPO = "autofit.probe.algos.ppo:build_trainer"


def test_ppo_probe_measures_four_models_and_lora_shares_the_reference(tmp_path):
    runner = ProcessRunner(PPO, None, tmp_path)
    full = Candidate("ppo", "tiny-qwen2", "cpu", micro_batch=2, grad_accum=1, max_length=8, prompt_length=8)
    full_result = runner.run(full, 2)
    lora_result = runner.run(full.replace(lora=LoraSettings()), 2)
    assert full_result.outcome is Outcome.OK, full_result.error
    assert lora_result.outcome is Outcome.OK, lora_result.error
    assert full_result.steps == 2
    assert {"generation", "scoring", "forward_backward", "optimizer_step"} <= set(full_result.phase_peaks)
    # policy + reference (causal LMs) + reward + value (classification heads on the same backbone)
    weights = 4 * 5_730_000 * 4  # about 4 models of tiny-qwen2's ~5.7M fp32 parameters, lm_heads aside
    assert full_result.phase_peaks["load"] > 0.6 * weights
    # under LoRA the reference is the policy with its adapter disabled: one causal LM fewer
    saved = full_result.phase_peaks["load"] - lora_result.phase_peaks["load"]
    assert saved > 0.8 * 5_730_000 * 4 * 0.9


def test_ppo_search_end_to_end_loads_into_ppo_config(tmp_path):
    from trl.experimental.ppo import PPOConfig

    code = cli.main(["search", "--model", "tiny-qwen2", "--algo", "ppo", "--device", "cpu", "--gpu-memory", "150MiB",
                     "--max-completion-length", "8", "--max-prompt-length", "8", "--effective-batch", "2",
                     "--ladder", "lora", "--verify-steps", "3", "--out", str(tmp_path)])
    best = json.loads((tmp_path / "best.json").read_text())
    assert code == 0 and best["fits"], best["candidates"]
    assert best["rungs"] == ["lora"]
    assert best["candidates"][0]["outcome"] == "OOM"  # full fine-tuning of policy and value does not fit
    assert best["verified"]["peak_bytes"] <= 150 * 2**20
    config = PPOConfig(output_dir=str(tmp_path / "run"), **best["config"])
    assert config.response_length == 8 and config.per_device_train_batch_size * config.gradient_accumulation_steps == 2
    assert "total_episodes" not in best["config"]  # probe-only


# The probe's phases and the ledger's: the meter names a PPO update's generation and scoring as the ledger does; its
# forward_backward holds the ledger's train and backward moments and the end of the backward (the ledger's step, every
# gradient computed), its optimizer_step the step.
METER_PHASES = {"generation": ("generation",), "scoring": ("scoring",),
                "forward_backward": ("train", "backward", "step"), "optimizer_step": ("step",)}


@pytest.mark.parametrize("changes", [
    dict(micro_batch=4, max_length=32, prompt_length=16),
    dict(micro_batch=4, grad_accum=2, max_length=64, prompt_length=32),
    dict(micro_batch=4, max_length=32, prompt_length=16, lora=LoraSettings()),
])
def test_ppo_probe_peaks_agree_with_the_prediction(changes, tmp_path):
    """As for the other algorithms (test_families.py, test_memory_model's recorded probes): the uncalibrated
    prior within 5 % of the CPU meter, at the peak and phase by phase."""
    from autofit.memory_model import predict

    candidate = Candidate("ppo", "tiny-qwen2", "cpu", **{"grad_accum": 1, **changes})
    result = ProcessRunner(PPO, None, tmp_path).run(candidate, 2)
    assert result.outcome is Outcome.OK, result.error
    ledger = predict(candidate)
    assert ledger.total / result.peak_bytes == pytest.approx(1.0, abs=0.05)
    for meter_phase, ledger_phases in METER_PHASES.items():
        predicted = max(ledger.phase_totals[name] for name in ledger_phases)
        assert predicted / result.phase_peaks[meter_phase] == pytest.approx(1.0, abs=0.05), meter_phase
