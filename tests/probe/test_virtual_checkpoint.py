"""Weightless checkpoints: what a probe loads costs neither disk nor host memory in proportion to the model, and the
model TRL loads from it has finite, non-zero weights in every rung's form (full, 4-bit, 8-bit)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, BitsAndBytesConfig, PreTrainedModel

from autofit.machine import resolve_model
from autofit.probe import _virtual_checkpoint as virtual_checkpoint

GiB = 2**30


def hf_config(name: str):
    settings = dict(resolve_model(name).config)
    return AutoConfig.for_model(settings.pop("model_type"), **settings)


def tiny_config():
    return AutoConfig.for_model("qwen2", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, vocab_size=512, dtype="bfloat16")


def written_tensors(folder: Path):
    found = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            for key in handle.keys():
                found[key] = tuple(handle.get_slice(key).get_shape())
    return found


def header_size(path: Path) -> int:
    with open(path, "rb") as handle:
        return int.from_bytes(handle.read(8), "little")


PREPARE = """
import json, resource, sys, time
from pathlib import Path
from transformers import AutoConfig
from autofit.probe import _virtual_checkpoint as virtual_checkpoint
from autofit.machine._registry import resolve_model
settings = dict(resolve_model(sys.argv[1]).config)
config = AutoConfig.for_model(settings.pop("model_type"), **settings)
written = virtual_checkpoint.write(config, Path(sys.argv[2]))
print(json.dumps({**written, "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def test_a_7b_checkpoint_takes_no_disk_and_little_host_memory(tmp_path):
    """Qwen2.5-7B's configuration: 15.2 GB of bf16 tensors, written as holes by a process that never holds them."""
    folder = tmp_path / "qwen7b"
    done = subprocess.run([sys.executable, "-c", PREPARE, "Qwen/Qwen2.5-7B", str(folder)], capture_output=True,
                          text=True, timeout=600, check=True)
    written = json.loads(done.stdout.strip().splitlines()[-1])
    on_disk = sum(virtual_checkpoint.allocated_bytes(path) for path in folder.iterdir())
    assert written["tensor_bytes"] == 15_231_233_024  # 7.62B parameters in bf16, the LM head untied
    assert on_disk < 1 * 2**20, on_disk  # the headers and configuration: kilobytes, not gigabytes
    assert written["max_rss_bytes"] < 2 * GiB, written["max_rss_bytes"]
    tensors = written_tensors(folder)
    assert len(tensors) == 339 and tensors["lm_head.weight"] == (152064, 3584)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    with safe_open(str(folder / index["weight_map"]["model.layers.27.mlp.down_proj.weight"]), framework="pt") as handle:
        assert not handle.get_slice("model.layers.27.mlp.down_proj.weight")[:4, :4].any()  # the hole reads as zeros


def test_a_70b_checkpoint_is_sharded_like_save_pretrained(tmp_path):
    written = virtual_checkpoint.write(hf_config("meta-llama/Llama-3.1-70B"), tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) == 30 and set(index["weight_map"].values()) == {path.name for path in shards}
    assert written["tensor_bytes"] == 141_107_412_992 == sum(path.stat().st_size - 8 - header_size(path)
                                                             for path in shards)
    assert written["allocated_bytes"] < 1 * 2**20
    assert set(written_tensors(tmp_path)) == set(index["weight_map"])


def test_loaded_weights_are_filled_with_finite_values(tmp_path):
    virtual_checkpoint.write(tiny_config(), tmp_path)
    original = PreTrainedModel.__dict__["from_pretrained"]
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert not any(param.any() for param in plain.parameters())  # the file itself stores nothing
    with virtual_checkpoint.fill_on_load():
        model = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, param in model.named_parameters():
        assert torch.isfinite(param).all(), name
        if param.ndim == 2:
            assert 0.015 < float(param.detach().float().std()) < 0.025, name
    assert float(model.model.layers[0].input_layernorm.weight.detach().min()) == 1.0
    assert PreTrainedModel.__dict__["from_pretrained"] is original  # the hook is gone again
    text = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=True)
    assert text.shape == (1, 7)


def test_a_mixture_of_experts_loads_every_weight(tmp_path):
    config = AutoConfig.for_model("mixtral", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512, num_local_experts=4)
    virtual_checkpoint.write(config, tmp_path)
    assert any(".experts.0." in key for key in written_tensors(tmp_path))  # the checkpoint's per-expert layout
    with virtual_checkpoint.fill_on_load():
        model, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert all(bool(torch.isfinite(param).all()) and param.any() for name, param in model.named_parameters()
               if param.ndim >= 2)


@pytest.mark.parametrize("quantization", [
    {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True},
    {"load_in_8bit": True},
], ids=["4bit", "4bit-double-quant", "8bit"])
def test_quantized_layers_get_codes_and_scales(tmp_path, quantization):
    import bitsandbytes.functional as bnb_functional

    virtual_checkpoint.write(tiny_config(), tmp_path)
    with virtual_checkpoint.fill_on_load():
        model = AutoModelForCausalLM.from_pretrained(
            tmp_path, quantization_config=BitsAndBytesConfig(**quantization), device_map="cpu", dtype=torch.bfloat16)
    layer = model.model.layers[1].mlp.up_proj
    weight = layer.weight
    if "load_in_4bit" in quantization:
        values = bnb_functional.dequantize_4bit(weight.data, weight.quant_state).float()
    else:
        values = weight.data.float() * weight.SCB.float().view(-1, 1) / 127
    assert values.shape == (256, 128) and torch.isfinite(values).all()
    assert 0.01 < float(values.std()) < 0.04 and float(values.abs().max()) <= 0.051
    logits = model(torch.tensor([[5, 6, 7, 8]])).logits
    assert torch.isfinite(logits).all() and float(logits.float().std()) > 0


@pytest.mark.slow
def test_a_probe_trains_a_filled_model_from_a_weightless_checkpoint(tmp_path):
    """End to end: a GRPO search whose factory refuses a model with unfilled weights fits (generation included)."""
    import autofit

    result = autofit.fit("probe_factories:checks_its_weights", model="tiny-qwen2", algo="grpo", device="cpu",
                         gpu_memory="2GiB", max_completion_length=8, max_prompt_length=8, effective_batch=4,
                         num_generations=4, verify_steps=3, out_dir=tmp_path, quiet=True)
    best = json.loads(result.best_json.read_text())
    assert best["fits"] and all(record["outcome"] == "OK" for record in best["candidates"])
    exported = Path(best["model_args"]["model_name_or_path"])  # a bundled toy: the filled copy, for `make train`
    assert not virtual_checkpoint.is_virtual(exported) and exported.name.startswith("tiny-qwen2-filled-")
    with safe_open(str(exported / "model.safetensors"), framework="pt") as handle:
        assert float(handle.get_tensor("model.layers.0.mlp.up_proj.weight").float().std()) > 0.01


def test_trust_remote_code_for_a_model_without_code_of_its_own_builds_from_its_configuration(tmp_path, monkeypatch):
    """Issue 50, item 5: ``model_init_kwargs: {trust_remote_code: true}`` for a model with no ``auto_map`` (a bundled
    name) looked the name up on the hub and exited 4 with a nonsense URL; there is no code to trust, and TRL loads
    such a model as any other."""
    from autofit.core import Candidate
    from autofit.probe import kit

    monkeypatch.setenv("AUTOFIT_CACHE", str(tmp_path / "cache"))  # cold: the checkpoint is written now
    fields = dict(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=1, grad_accum=1, max_length=32)
    trusted = kit.model_path(Candidate(**fields, trust_remote_code=True))
    assert trusted == kit.model_path(Candidate(**fields)) and (Path(trusted) / "config.json").is_file()
