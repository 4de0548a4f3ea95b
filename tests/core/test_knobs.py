"""The knob table (issue 45, item 1): each knob's keys are spelled once, every stage's view of them is derived from
the table, and every knob comes back whole through what writes it and what reads it: a TRL file (best.yaml's keys,
parsed by TRL's own parser) and a trainer built from the candidate (read back as a probe reads it)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from autofit.core import (
    SEARCHED_ARGS,
    Candidate,
    LoraSettings,
    as_trained,
    blocks,
    keys_of,
)
from autofit.core._knob_table import KNOBS
from autofit.core._settings import QuantSettings
from autofit.export._answer import knob_model_args as model_args
from autofit.export._words import knob_of_key
from autofit.launch import MAPPED, read_trl_file
from autofit.launch._file_knobs import file_baseline, file_options, read_keys
from autofit.memory_model import classify_key
from autofit.rungs import knob

LORA = LoraSettings(r=8, alpha=16, dropout=0.05, target_modules=("q_proj", "v_proj"), modules_to_save=("lm_head",),
                    use_rslora=True)
FP4 = QuantSettings(quant_type="fp4", nested=False, storage="bfloat16")
SFT = Candidate("sft", "tiny-qwen2", "cpu", micro_batch=2, grad_accum=4, max_length=64, checkpointing=True,
                optim="adamw_8bit", lora=LORA, quantization="4bit", bnb=FP4, dtype="bfloat16",
                activation_offload=True, attn_implementation="eager", trust_remote_code=True,
                env=(("AUTOFIT_MARK", "1"),))
GRPO = Candidate("grpo", "tiny-qwen2", "cpu", micro_batch=4, grad_accum=1, max_length=32, num_generations=4,
                 vllm="colocate", vllm_utilization=0.5, user_args=(("beta", 0.04),))


def test_each_key_and_each_field_belongs_to_one_knob():
    keys = [key for k in KNOBS for key in k.keys]
    fields = [name for k in KNOBS for name in k.fields]
    assert len(keys) == len(set(keys)) and len(fields) == len(set(fields))
    assert set(fields) <= {f.name for f in dataclasses.fields(Candidate)}
    assert knob_of_key("lora_modules_to_save") is knob("lora") and knob_of_key("learning_rate") is None


def test_the_stages_views_are_derived_from_the_table():
    for k in KNOBS:  # the key table's rows of the knobs' keys are the knobs' words
        for key, words in {**k.training_keys, **k.model_keys}.items():
            assert classify_key(key) == (k.kind, words)
    assert set(keys_of("batch", "checkpointing", "length", "num_generations")) <= set(SEARCHED_ARGS)
    assert "response_length" in SEARCHED_ARGS  # every algorithm's length field, PPO's included
    assert MAPPED == set(read_keys()) >= {"optim", "use_vllm", "beta", "trust_remote_code"}
    assert set(blocks(SFT)) == {"peft", "quantization"}


def _written(candidate: Candidate, path) -> None:
    """The candidate as best.yaml writes it: ModelConfig's keys, the training arguments, the env block."""
    args = {"model_name_or_path": candidate.model, **model_args(candidate, {"attn_implementation":
                                                                            candidate.attn_implementation}),
            **candidate.training_args()}
    if candidate.env:
        args["env"] = dict(candidate.env)
    path.write_text(yaml.safe_dump(args))


def test_every_knob_comes_back_from_a_trl_file(tmp_path):
    """best.yaml's keys, read by TRL's parser and then by the knobs: the ladder's first level (the baseline) and the
    search's options are the candidate that wrote them."""
    _written(SFT, tmp_path / "sft.yaml")
    run = read_trl_file(str(tmp_path / "sft.yaml"), "sft").run
    baseline = dict(file_baseline(run))
    for name in ("checkpointing", "optim", "lora", "quantization", "bnb", "activation_offload", "attn_implementation",
                 "env"):
        assert baseline[name] == getattr(SFT, name), name
    assert file_options(run) == {"effective_batch": 8, "max_length": 64, "dtype": "bfloat16",
                                 "trust_remote_code": True}

    _written(GRPO, tmp_path / "grpo.yaml")
    options = file_options(read_trl_file(str(tmp_path / "grpo.yaml"), "grpo").run)
    assert options == {"effective_batch": 4, "max_completion_length": 32, "num_generations": 4, "beta": 0.04,
                       "use_vllm": "colocate", "vllm_gpu_memory_utilization": 0.5}
    # what no reader takes: Liger's keys pass through to the probes as the user wrote them; the engine's keys are
    # the launch's (autofit.launch)
    assert [k.name for k in KNOBS if not (k.baseline or k.options)] == ["liger", "engine"]


BUILD = """
import json, sys
from autofit.core import Candidate, ProbeSettings
from autofit.probe.algos import rl, sft
from autofit.probe._observe import describe_trainer, observe_trainer

seen = {}
builders = {"sft": (sft.build_trainer, sys.argv[1]), "grpo": (rl.build_grpo_trainer, sys.argv[2])}
for name, (build, data) in builders.items():
    candidate = Candidate.from_dict(json.loads(data))
    candidate = candidate.replace(probe=ProbeSettings(steps=1, output_dir=sys.argv[3]))
    seen[name] = describe_trainer(build(candidate), candidate)
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_every_knob_comes_back_from_a_built_trainer(tmp_path):
    """Built by the built-in factories from the candidate and read back as a probe reads it: a trainer of the user's
    own with the same settings is predicted and exported as this candidate (its LoRA's modules_to_save and use_rslora,
    its fp4 base without nested quantization, its generations)."""
    sft = SFT.replace(bnb=QuantSettings(quant_type="fp4", nested=False), dtype=None, attn_implementation=None,
                      activation_offload=False, trust_remote_code=False, optim=None)
    done = subprocess.run([sys.executable, "-c", BUILD, json.dumps(sft.to_dict()), json.dumps(GRPO.replace(
        vllm=None, vllm_utilization=None).to_dict()), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    bare = sft.replace(lora=None, quantization=None, bnb=None)
    trained = as_trained(bare, seen["sft"])
    assert (trained.lora, trained.quantization, trained.bnb) == (sft.lora, "4bit", sft.bnb)
    assert as_trained(GRPO.replace(num_generations=None), seen["grpo"]).num_generations == 4
    assert seen["sft"]["args"]["checkpointing"] is True and seen["sft"]["args"]["optim"] == "adamw_torch_fused"
