"""The output's words (issue 61, item 6): every key autofit changed or added in best.yaml, relative to the user's run
(the ladder's first level), says the rung that wrote it and what it was: ``# micro-batch (effective batch kept); was
8`` in the file autofit writes, ``# autofit: was 8; micro-batch`` in the user's own (``--config``). Searches at
several ladder levels, on the formula runner (nothing trained)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

import pytest
from fakes import FormulaRunner, MiB, formula_spec
from ruamel.yaml import YAML

from autofit.core import TrlFile
from autofit.core._compat import checkpointing_field
from autofit.export import answer, yaml_text
from autofit.export._answer import model_args, training_args
from autofit.export._user_yaml import user_yaml
from autofit.export._words import shown, was, why
from autofit.rungs import resolve_ladder
from autofit.search import Search

# (budget in MiB, runner's formula): the levels the search stops at, from the user's run to every quality rung
LEVELS = {
    "user's run": (1200, {}),
    "micro-batch": (700, {}),
    "checkpointing+offload": (150, {}),
    "lora+8-bit": (30, {}),
    "shorter-length": (20, {"weight_bytes": 4 * MiB, "act_bytes_per_token": 2 * MiB}),
}


def _rung_of(key: str, rungs) -> Optional[str]:
    """The rung that writes ``key`` (independent of the rungs' own ``comment``); "baseline": the search's own start,
    checkpointing off, which no rung decided; None: no rung's (the model)."""
    checkpointing = checkpointing_field()  # gradient_checkpointing before transformers 5.23 (the floor's)
    if key == checkpointing and "checkpointing" not in rungs:
        return "baseline"
    if key == "use_peft" or key.startswith("lora_"):
        return "lora" if "lora" in rungs else next(r for r in rungs if r.startswith("quant-"))
    if key.startswith(("load_in_4bit", "bnb_4bit", "use_bnb_")):
        return "quant-4bit"
    return {"per_device_train_batch_size": "micro-batch", "gradient_accumulation_steps": "micro-batch",
            checkpointing: "checkpointing", "activation_offloading": "activation-offload",
            "dtype": "bf16-weights", "model_init_kwargs": "bf16-weights", "optim": "optimizer-8bit",
            "load_in_8bit": "quant-8bit", "max_length": "shorter-length",
            "env.PYTORCH_ALLOC_CONF": "expandable-segments"}.get(key)


def _search(tmp_path: Path, level: str):
    budget, formula = LEVELS[level]
    spec = formula_spec(tmp_path, budget * MiB, min_length=64)
    report = Search(spec, FormulaRunner(spec.budget_bytes, **formula), resolve_ladder(None)).run()
    assert report.fits
    return report


def _exported(candidate) -> Dict[str, Any]:
    return {**model_args(candidate), **training_args(candidate), **{f"env.{k}": v for k, v in candidate.env}}


@pytest.mark.parametrize("level", list(LEVELS))
def test_every_key_autofit_changed_names_its_rung_and_what_it_was(tmp_path, level):
    report = _search(tmp_path, level)
    found = answer(report, tmp_path)
    assert found is not None
    rungs = found.candidate.rungs
    before, now = _exported(report.levels[0].candidate), {**found.written,
                                                          **{f"env.{k}": v for k, v in found.env}}
    changed = [key for key, value in now.items() if key not in before or before[key] != value]
    assert bool(changed) == bool(rungs), (level, rungs, changed)
    text = yaml_text(found).splitlines()
    for key in now:
        comment = found.comments[key]
        name = key.removeprefix("env.")
        line = next(line for line in text if line.lstrip().startswith(f"{name}: "))
        assert line.endswith(f"  # {comment}"), line
        if key not in changed:
            assert "; was " not in comment, (key, comment)  # the user's own, or what no rung decided: its reason
            continue
        rung = _rung_of(key, rungs)
        assert rung in rungs, (key, rung, rungs)
        assert comment.startswith(rung), (key, comment)
        said = f"was {shown(before[key])}" if key in before else "was unset"
        assert comment.endswith(f"; {said}"), (key, comment)
    if level == "shorter-length":
        assert found.comments["max_length"].startswith("shorter-length") and "; was 512" in found.comments["max_length"]
    if level == "micro-batch":
        assert found.comments["per_device_train_batch_size"] == "micro-batch (effective batch kept); was 8"
        assert found.comments["env.PYTORCH_ALLOC_CONF"] == "expandable-segments; was unset"


def test_a_key_left_at_trl_s_default_in_the_user_s_run_says_that_default():
    assert was("optim", "adamw_bnb_8bit", {}, {"optim": "adamw_torch_fused"}) == (
        "was adamw_torch_fused (TRL default)")
    assert was("optim", "adamw_torch_fused", {}, {"optim": "adamw_torch_fused"}) is None
    assert was("activation_checkpointing", True, {"activation_checkpointing": False}, {}) == "was false"
    assert was("lora_r", 16, {}, {}) == "was unset"
    assert shown({"dtype": "bfloat16"}) == "{dtype: bfloat16}" and shown(None) == "unset"
    assert shown(("q_proj", "v_proj")) == "[q_proj, v_proj]" and shown(object).startswith("<class")


USER_FILE = """\
# my run
model_name_or_path: tiny-qwen2
per_device_train_batch_size: 8
gradient_accumulation_steps: 1
max_length: 512
learning_rate: 2.0e-5  # mine
"""


@pytest.mark.parametrize("level", ["micro-batch", "lora+8-bit", "shorter-length"])
def test_in_the_user_s_own_file_every_change_says_what_it_was_and_its_rung(tmp_path, level):
    report = _search(tmp_path, level)
    found = answer(report, tmp_path)
    assert found is not None
    candidate = found.candidate
    path = tmp_path / "mine.yaml"
    path.write_text(USER_FILE)
    keys = YAML(typ="safe").load(USER_FILE)
    model = {k: v for k, v in keys.items() if k == "model_name_or_path"}
    user = TrlFile(path=str(path), algo="sft", text=USER_FILE, written=keys, model=model,
                   training={k: v for k, v in keys.items() if k not in model})
    text, changes = user_yaml(user, candidate, {**model_args(candidate), **training_args(candidate)},
                              lambda key: why(key, candidate, 512, "batch"), ["# autofit: header"])
    lines = text.splitlines()
    assert "learning_rate: 2.0e-5  # mine" in lines  # the user's own key, as written
    assert changes
    for change in changes:
        key = change["key"]
        name = key.removeprefix("env.")
        line = next(line for line in lines if line.lstrip().startswith(f"{name}: "))
        _, _, comment = line.partition(" # ")
        said = f"was {change['was']}" if not change["added"] else "added"
        assert comment.startswith(f"autofit: {said}"), line
        rung = _rung_of(key, candidate.rungs)
        if key == "model_name_or_path":
            assert "bundled with autofit" in comment  # no rung's: the reason
            continue
        assert rung in (*candidate.rungs, "baseline") and f"; {rung}" in comment, (line, rung)
