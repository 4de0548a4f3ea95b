"""Real TRL GRPO and RLOO probes on tiny models, in probe processes, under the simulated meter."""

import importlib.util
import json
from pathlib import Path

import pytest

from autofit import cli
from autofit.core import Candidate, LoraSettings, Outcome
from autofit.probe import ProcessRunner

pytestmark = pytest.mark.slow

GRPO = "autofit.probe.algos.rl:build_grpo_trainer"
RLOO = "autofit.probe.algos.rl:build_rloo_trainer"


@pytest.fixture(scope="module")
def big_vocab_model(tmp_path_factory):
    """A one-layer model with Qwen2.5's vocabulary: generating 32 completions at once holds 32 x 151,936 logits
    several times over, while training a micro-batch of 2 does not (TRL's fused LM head works in chunks)."""
    folder = tmp_path_factory.mktemp("big-vocab")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 151936,
        "max_position_embeddings": 1024, "tie_word_embeddings": True, "torch_dtype": "float32",
    }))
    return str(folder)


def test_grpo_search_end_to_end(tmp_path):
    from trl import GRPOConfig, ModelConfig, TrlParser

    # 16 generated tokens after 8-token prompts (each probe generates token by token): 100 MiB still needs a rung
    code = cli.main(["search", "--model", "tiny-qwen2", "--algo", "grpo", "--device", "cpu", "--gpu-memory", "100MiB",
                     "--max-completion-length", "16", "--max-prompt-length", "8", "--num-generations", "4",
                     "--verify-steps", "3", "--out", str(tmp_path)])
    best = json.loads((tmp_path / "best.json").read_text())
    assert code == 0 and best["fits"], best["candidates"]
    assert best["rungs"], "100 MiB is below the baseline's peak: a rung is needed"
    assert best["verified"]["peak_bytes"] <= 100 * 2**20
    assert {"generation", "scoring", "forward_backward", "optimizer_step"} <= set(best["verified"]["phase_peaks"])
    config = best["config"]
    assert config["num_generations"] == 4 and config["max_completion_length"] == 16
    assert config["per_device_train_batch_size"] * config["gradient_accumulation_steps"] == 8
    assert "generation_kwargs" not in config  # the forced full-length completions are probe-only
    # generation throughput apart from training throughput: completions of 16 tokens, 8 per generation
    assert best["generation_tokens_per_second"] > 0
    assert best["generation_tokens_per_second"] != best["tokens_per_second"]
    if importlib.util.find_spec("vllm") is None:
        assert any("vLLM is not installed" in note for note in best["notes"])
    parsed, _ = TrlParser((GRPOConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(tmp_path / "best.yaml"), "--output_dir", str(tmp_path / "run")]
    )
    assert parsed.num_generations == 4 and parsed.max_completion_length == 16
    assert parsed.per_device_train_batch_size == config["per_device_train_batch_size"]
    assert parsed.generation_batch_size % parsed.num_generations == 0
    # what the user trades and what was measured: the prompt length (GRPOConfig has no field for it), the attention
    assert "# measured with prompts of 8 tokens" in (tmp_path / "best.yaml").read_text()
    assert len(best["trades"]) == len(best["rungs"]) and all(best["trades"])
    assert best["model_args"]["attn_implementation"] == "sdpa"


def test_probe_sees_a_generation_phase_that_alone_exceeds_the_budget(tmp_path, big_vocab_model):
    candidate = Candidate("grpo", big_vocab_model, "cpu", micro_batch=2, grad_accum=16, max_length=8,
                          num_generations=32, prompt_length=8, checkpointing=True)
    free = ProcessRunner(GRPO, None, tmp_path / "free").run(candidate, 1)
    assert free.outcome is Outcome.OK, free.error
    generation, training = free.phase_peaks["generation"], free.phase_peaks["forward_backward"]
    assert generation > training * 1.3, free.phase_peaks
    budget = (generation + training) // 2  # training alone would fit
    capped = ProcessRunner(GRPO, budget, tmp_path / "capped").run(candidate, 1)
    assert capped.outcome is Outcome.OOM
    assert capped.error_phase == "generation"
    # with vLLM to generate (estimated: not installed here), that phase is measured but is not the trainer's
    assert importlib.util.find_spec("vllm") is None
    trainer_only = ProcessRunner(GRPO, budget, tmp_path / "vllm").run(candidate.replace(vllm="colocate"), 1)
    assert trainer_only.outcome is Outcome.OK, trainer_only.error
    assert trainer_only.phase_peaks["generation"] > budget >= trainer_only.peak_bytes
    assert trainer_only.peak_bytes == max(peak for phase, peak in trainer_only.phase_peaks.items()
                                          if phase != "generation")


def test_reference_model_is_measured_not_assumed(tmp_path):
    runner = ProcessRunner(RLOO, None, tmp_path)
    base = Candidate("rloo", "tiny-qwen2", "cpu", micro_batch=2, grad_accum=1, max_length=8, num_generations=2,
                     prompt_length=8)
    without_ref = runner.run(base.replace(user_args=(("beta", 0.0),)), 2)
    with_ref = runner.run(base.replace(user_args=(("beta", 0.1),)), 2)
    lora_with_beta = runner.run(base.replace(user_args=(("beta", 0.1),), lora=LoraSettings()), 2)
    for result in (without_ref, with_ref, lora_with_beta):
        assert result.outcome is Outcome.OK, result.error
    weights = without_ref.phase_peaks["load"]
    # beta > 0 loads a second copy of the weights (the reference model) ...
    assert with_ref.phase_peaks["load"] - without_ref.phase_peaks["load"] > 0.9 * weights
    # ... but not under LoRA, where the reference is the base model with the adapter disabled
    assert lora_with_beta.phase_peaks["load"] < 1.1 * weights


def test_trl_rejecting_the_configuration_is_bad_input(tmp_path, capsys):
    # No --num-generations: TRL's own default (8) does not divide an effective batch of 6; TRL says so.
    code = cli.main(["search", "--model", "tiny-qwen2", "--algo", "grpo", "--device", "cpu", "--gpu-memory", "1GiB",
                     "--max-completion-length", "8", "--max-prompt-length", "8", "--effective-batch", "6",
                     "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "divisible by num_generations" in err and len(err.strip().splitlines()) == 1
    assert len(list(Path(tmp_path).glob("probes/*/result.json"))) == 1


@pytest.mark.parametrize("checkpointing", [False, True])
def test_probe_generation_uses_the_kv_cache(tmp_path, checkpointing):
    # Generation speed on a GPU depends on it: with the KV cache each new token is one position through the model;
    # without it (checkpointing left on during generate, say) every step re-runs the whole sequence.
    from autofit.core import ProbeSettings
    from autofit.probe.algos.rl import build_grpo_trainer

    candidate = Candidate("grpo", "tiny-qwen2", "cpu", micro_batch=4, grad_accum=1, max_length=12, num_generations=2,
                          prompt_length=8, checkpointing=checkpointing,
                          probe=ProbeSettings(steps=1, output_dir=str(tmp_path / "trainer")))
    trainer = build_grpo_trainer(candidate)
    widths, generating = [], []
    model = trainer.model
    model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]) if generating else None,
        with_kwargs=True)
    original = trainer._generate

    def generate(*args, **kwargs):
        generating.append(True)
        try:
            return original(*args, **kwargs)
        finally:
            generating.clear()

    trainer._generate = generate
    trainer.train()
    assert widths[0] >= 8  # the prefill: the whole prompt
    assert len(widths) >= 12 and set(widths[1:]) == {1}  # then one new position per token: the cache is used
