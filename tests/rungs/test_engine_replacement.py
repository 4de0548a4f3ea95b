"""A launch's own engine and the rungs that would replace it (issue 39, item 2's last sentence): the engine of the
user's launch (``fsdp:``/``fsdp_config:``, a ``deepspeed:`` block, ``accelerate_config:``) keeps every rung that does
not replace it; autofit's sharding and offload rungs stay in the ladder as quality levels after those, their trade
said, and a chosen one runs (probe) and is written (best.yaml) without the user's engine keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fakes import DEEPSPEED, at_door_values

from autofit import cli
from autofit.core import SearchOptions
from autofit.export import trades
from autofit.export._answer import model_args, training_args
from autofit.export._user_yaml import user_yaml
from autofit.launch import read_launch, read_trl_file
from autofit.memory_model import base_candidate, unmodelled
from autofit.probe import _steps as steps
from autofit.rungs import DEFAULT_LADDER, QUALITY, SPEED, LadderState, climb, usable_rungs
from autofit.search import estimate_question

F1 = Path(__file__).resolve().parents[2] / "benchmarks" / "public" / "F1.yaml"
F1_ARGS = ["--config", str(F1), "--model", "benchmarks/models/Llama-2-70b-hf", "--gpus", "8", "--gpu-memory", "H100"]
FSDP = """model_name_or_path: Qwen/Qwen2.5-7B
max_length: 1024
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
gradient_checkpointing: false
learning_rate: 2.0e-5
fsdp: "full_shard auto_wrap"   # our launch's FSDP
fsdp_config:
  fsdp_version: 2
  reshard_after_forward: true
"""
REPLACING = ("zero1", "zero2", "fsdp2", "zero3", "optimizer-offload", "fsdp2-offload", "zero3-offload")
ENGINE_KEYS = ("fsdp", "fsdp_config", "deepspeed", "accelerate_config")


def _start(tmp_path: Path, text: str, gpus: int = 4) -> LadderState:
    path = tmp_path / "sft.yaml"
    path.write_text(text, encoding="utf-8")
    values = at_door_values({"config": str(path), "gpu_memory": 80 * 2**30, "device": "cuda", "gpus": gpus})
    return LadderState(base_candidate(estimate_question(SearchOptions(**values))))


def test_the_users_engine_keeps_the_rungs_that_do_not_replace_it_and_the_others_come_last(tmp_path):
    start = _start(tmp_path, FSDP)
    assert start.candidate.sharding == "fsdp2" and dict(start.candidate.user_args)["fsdp"]
    levels = climb(start, DEFAULT_LADDER)
    keeping = [level for level in levels if not level.candidate.replaces]
    replacing = levels[len(keeping):]
    assert all(not level.candidate.replaces for level in keeping)  # every replacing level after every keeping one
    kept = {name for level in keeping for name in level.rungs}
    assert {"micro-batch", "checkpointing", "bf16-weights", "optimizer-8bit", "lora", "quant-8bit",
            "quant-4bit"} <= kept
    assert not kept & set(REPLACING)
    for level in keeping:  # each with the launch's FSDP as written: the probe runs it, best.yaml keeps it
        assert level.candidate.sharding == "fsdp2" and "fsdp" in dict(level.candidate.user_args)
    assert [level.rungs[-1] for level in replacing] == ["zero3", "optimizer-offload", "fsdp2-offload", "zero3-offload"]
    speed_level = next(level for level in reversed(keeping) if level.cost != QUALITY)
    for level in replacing:  # from the last level that changes no training, a quality level without the user's keys
        assert level.cost == QUALITY and level.candidate.replaces == "FSDP (fsdp:, fsdp_config:)"
        assert not set(ENGINE_KEYS) & set(dict(level.candidate.user_args))
        assert dict(level.candidate.user_args)["learning_rate"] == 2e-5
        assert level.candidate.lora is None and level.candidate.quantization is None
        assert set(speed_level.rungs) <= set(level.rungs) | {"activation-offload"}
    assert replacing[0].candidate.engine == "zero3" and replacing[1].candidate.engine == "zero2-offload"
    usable, notes = usable_rungs(DEFAULT_LADDER, "cuda", start)  # in the order climbed: the search ranks fits by it
    assert [rung.name for rung in usable][-4:] == ["zero3", "optimizer-offload", "fsdp2-offload", "zero3-offload"]
    assert any(note.startswith("rungs zero3, optimizer-offload, fsdp2-offload, zero3-offload would replace your "
                               "launch's FSDP (fsdp:, fsdp_config:) with autofit's engine") for note in notes)


def test_without_an_engine_of_the_users_the_ladder_is_unchanged(tmp_path):
    text = "\n".join(line for line in FSDP.splitlines() if not line.startswith(("fsdp", "  fsdp", "  resh")))
    levels = climb(_start(tmp_path, text + "\n"), DEFAULT_LADDER)
    assert not any(level.candidate.replaces for level in levels)
    zero3 = next(level for level in levels if level.rungs[-1:] == ("zero3",))
    assert zero3.cost == SPEED and levels.index(zero3) < [level.rungs[-1:] for level in levels].index(("lora",))


def test_a_users_offload_and_a_deepspeed_block_shard_no_less_where_replaced(tmp_path):
    offloading = _start(tmp_path, FSDP.replace('"full_shard auto_wrap"', '"full_shard offload auto_wrap"'))
    levels = climb(offloading, DEFAULT_LADDER)
    lora = next(level for level in levels if level.rungs and level.rungs[-1] == "lora")
    assert lora.candidate.sharding == "fsdp2-offload"  # a quality rung keeps the user's offload (a rung's it drops)
    assert [level.rungs[-1] for level in levels if level.candidate.replaces] == ["zero3-offload"]
    deepspeed = FSDP.split("fsdp:")[0] + "deepspeed:\n  zero_optimization:\n    stage: 2\n"
    levels = climb(_start(tmp_path, deepspeed), DEFAULT_LADDER)
    replacing = [level for level in levels if level.candidate.replaces]
    assert [level.rungs[-1] for level in replacing] == ["fsdp2", "zero3", "optimizer-offload", "fsdp2-offload",
                                                         "zero3-offload"]  # not zero1, zero2: no more than ZeRO-2
    assert all("deepspeed" not in dict(level.candidate.user_args) for level in replacing)
    assert all(unmodelled(level.candidate) == [] for level in replacing)  # no DeepSpeed of the user's under ours


def test_a_probe_of_a_replacing_level_runs_autofits_engine_without_the_users(tmp_path):
    start = _start(tmp_path, FSDP.split("fsdp:")[0] + "deepspeed:\n  zero_optimization:\n    stage: 2\n", gpus=1)
    assert [s.__class__.__name__ for s in steps.considered(start.candidate) if s.active(start.candidate)] == [
        "OwnDeepSpeedStep"]  # the user's own DeepSpeed run, as TRL's CLI launches it
    offload = climb(start, DEFAULT_LADDER)[-1].candidate
    assert offload.rungs[-1] == "optimizer-offload" and offload.engine == "zero2-offload"
    args = offload.training_args()
    assert "deepspeed" not in args and "fsdp" not in args and args["learning_rate"] == 2e-5
    active = [s.__class__.__name__ for s in steps.considered(offload) if s.active(offload)]
    assert "EngineStep" in active and "OwnDeepSpeedStep" not in active
    sentence = trades(offload, 1024)[-1]
    assert sentence.startswith("replaces your launch's DeepSpeed ZeRO-2 (deepspeed:) with DeepSpeed ZeRO-2 with the "
                               "optimizer offloaded (run best.yaml with the accelerate.yaml autofit writes, not your "
                               "own)")


def test_best_yaml_of_a_replacing_level_has_no_engine_key_of_the_users_and_says_why(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text(FSDP + "accelerate_config: fsdp2\n", encoding="utf-8")
    user = read_trl_file(str(path), "sft")
    start = _start(tmp_path, FSDP + "accelerate_config: fsdp2\n")
    chosen = next(level for level in climb(start, DEFAULT_LADDER) if level.rungs[-1:] == ("zero3",)).candidate
    exported = {**model_args(chosen), **training_args(chosen)}
    text, changes = user_yaml(user, chosen, exported, lambda key: "why", ["# header"])
    written = yaml.safe_load(text)
    assert not set(ENGINE_KEYS) & set(written) and written["learning_rate"] == 2e-5
    assert ("# autofit: removed fsdp:, fsdp_config:, accelerate_config:; your launch's FSDP (fsdp:, fsdp_config:) "
            "replaced by the zero3 rung's engine (zero3): run with the accelerate.yaml autofit writes, not your "
            "own") in text
    assert {c["key"] for c in changes if c.get("removed")} == {"fsdp", "fsdp_config", "accelerate_config"}
    out = tmp_path / "best.yaml"
    out.write_text(text, encoding="utf-8")
    again = read_launch({"config": str(out), "algo": "sft"})  # TRL's parser reads it: it runs no engine of the user's
    assert not again.file.training.get("fsdp") and not again.file.training.get("deepspeed")
    assert again.engine.sharding is None


def test_the_estimate_of_f1_lists_the_replacing_rungs_as_levels_with_their_trade(capsys):
    assert cli.main(["estimate", *F1_ARGS]) == 0
    out = capsys.readouterr().out
    assert "left out: your config runs its own" not in out
    assert "rungs zero3, fsdp2-offload, zero3-offload would replace your launch's FSDP (fsdp:, fsdp_config:)" in out
    rows = [line.split() for line in out.splitlines() if line[:5].strip().isdigit()]
    assert [row[1] for row in rows[-3:]] == ["+zero3", "+fsdp2-offload", "+zero3-offload"]
    assert rows[-3][2] == "-bf16-weights"  # from the last speed level, not from the quality rungs before it
    assert ("+zero3): replaces your launch's FSDP (fsdp:, fsdp_config:) with DeepSpeed ZeRO-3 across the GPUs: "
            "weights, gradients and optimizer states sharded (run best.yaml with the accelerate.yaml autofit writes, "
            "not your own); the same math") in out
    assert cli.main(["estimate", *F1_ARGS, "--json"]) == 0
    levels = json.loads(capsys.readouterr().out)["estimates"][0]["levels"]
    replacing = [level for level in levels if level["trade"]]
    assert [level["adds"] for level in replacing] == ["zero3", "fsdp2-offload", "zero3-offload"]
    assert all(level["cost"] == "quality" and level["trade"].startswith("replaces your launch's FSDP")
               and level["configuration"]["replaces"] == "FSDP (fsdp:, fsdp_config:)" for level in replacing)
    assert levels.index(replacing[0]) == len(levels) - 3


@pytest.mark.slow
def test_a_search_that_needs_autofits_engine_beside_the_files_own_chooses_it_and_writes_a_runnable_launch(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text(DEEPSPEED)  # ZeRO-2 of the file's own: 139.6 MiB measured at its peak on the CPU meter
    out = tmp_path / "out"
    assert cli.main(["search", "--config", str(path), "--device", "cpu", "--gpu-memory", "125MiB", "--ladder",
                     "optimizer-offload", "--out", str(out)]) == 0
    best = json.loads((out / "best.json").read_text())
    assert best["candidates"][0]["outcome"] == "OOM" and best["rungs"] == ["optimizer-offload"]
    assert best["trades"][-1].startswith("replaces your launch's DeepSpeed ZeRO-2 (deepspeed:) with DeepSpeed ZeRO-2 "
                                         "with the optimizer offloaded")
    text = (out / "best.yaml").read_text()
    assert "deepspeed" not in yaml.safe_load(text) and (out / "accelerate.yaml").exists()
    assert "# autofit: removed deepspeed:; your launch's DeepSpeed ZeRO-2 (deepspeed:) replaced by the " \
           "optimizer-offload rung's engine (zero2-offload)" in text
    assert "--accelerate_config accelerate.yaml" in text
