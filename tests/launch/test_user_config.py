"""Your TRL config in, your TRL config out (``--config FILE``): the file is read by TRL's own parser, its run is the
search's baseline (flags given at the door override it), ``estimate`` predicts it as written first, and best.yaml
is that file with only what fitting needed changed, each change commented."""

import json
from pathlib import Path

import pytest
from fakes import DEEPSPEED, at_door_values

import autofit
from autofit import _api as api
from autofit import cli
from autofit.core import SearchOptions
from autofit.memory_model import base_candidate
from autofit.search import question

# The file: LoRA r=64 on two modules, Adafactor, a learning rate and weight decay of the user's own.
SFT = """\
# my SFT run
model_name_or_path: tiny-qwen2
dataset_name: trl-lib/Capybara
use_peft: true
lora_r: 64
lora_target_modules: [q_proj, v_proj]
optim: adafactor
learning_rate: 3.0e-5    # tuned
weight_decay: 0.05
per_device_train_batch_size: 8   # one GPU
max_length: 128
"""
GRPO = """\
# GRPO on my prompts
model_name_or_path: tiny-qwen2
dataset_name: trl-lib/tldr
reward_funcs: [think_format_reward]
num_generations: 4
max_completion_length: 16
per_device_train_batch_size: 8
learning_rate: 1.0e-6
gradient_checkpointing: false
"""


def trl_reads(path: Path, algo: str, tmp_path: Path):
    """The file as `trl <algo> --config` reads it (on this CPU: --use_cpu)."""
    import importlib

    parser = importlib.import_module(f"trl.scripts.{algo}").make_parser()
    _, training, model, _ = parser.parse_args_and_config(
        args=["--config", str(path), "--use_cpu", "--output_dir", str(tmp_path / "run")])
    return training, model


@pytest.fixture
def sft_file(tmp_path) -> Path:
    path = tmp_path / "sft.yaml"
    path.write_text(SFT)
    return path


def test_the_files_run_is_the_baseline_and_flags_override_the_file(sft_file):
    values = at_door_values({"config": str(sft_file), "device": "cpu", "gpu_memory": "1GiB", "max_length": 64})
    assert values["model"] == "tiny-qwen2" and values["effective_batch"] == 8
    assert values["max_length"] == 64  # the flag given at the door, over the file's 128
    assert values["training_args"] == {"learning_rate": 3e-5, "weight_decay": 0.05}  # passed to every probe
    spec = question(SearchOptions(**values))
    baseline = base_candidate(spec)
    assert baseline.lora is not None and (baseline.lora.r, baseline.lora.target_modules) == (64, ("q_proj", "v_proj"))
    assert baseline.optim == "adafactor" and baseline.checkpointing  # TRL's default: on, as `trl sft` would run it
    assert (baseline.micro_batch, baseline.grad_accum, baseline.max_length) == (8, 1, 64)
    assert dict(baseline.user_args) == {"learning_rate": 3e-5, "weight_decay": 0.05}
    assert "baseline=" in spec.question_key()  # another file, another study


def test_the_files_batch_is_per_gpu_as_in_trl(sft_file):
    from autofit.search import estimate_question

    for gpus, nodes in ((4, 1), (2, 2)):
        values = at_door_values({"config": str(sft_file), "device": "cuda", "gpu_memory": "80GB", "gpus": gpus,
                              "nodes": nodes})
        assert values["effective_batch"] == 8 * gpus * nodes  # per_device_train_batch_size 8 on every GPU
        baseline = base_candidate(estimate_question(SearchOptions(**values)))
        assert (baseline.micro_batch, baseline.grad_accum, baseline.ranks) == (8, 1, gpus * nodes)


@pytest.mark.parametrize("content, named", [
    ("model_name_or_path: tiny-qwen2\nfoo: 1\n", "Unknown arguments from config file: ['--foo']"),
    ("per_device_train_batch_size: abc\n", "invalid int value: 'abc'"),
    ("lora_target_modules: [q_proj, v_proj\n", "while parsing a flow sequence"),
    ("- a list\n", "must contain a YAML mapping"),
    ("num_generations: 4\n", "another trainer? --algo"),  # a GRPO key in a file read for sft
])
def test_a_file_trl_refuses_is_one_line_exit_2(tmp_path, capsys, content, named):
    path = tmp_path / "run.yaml"
    path.write_text(content)
    code = cli.main(["estimate", "--config", str(path), "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory",
                     "1GiB"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"autofit: error: --config {path}: ") and named in err


def test_estimate_predicts_the_file_as_written_first(sft_file, capsys):
    for budget, verdict in (("1GiB", "fits in 1.00 GiB"), ("300MiB", "does not fit")):
        assert cli.main(["estimate", "--config", str(sft_file), "--device", "cpu", "--gpu-memory", budget]) == 0
        lines = capsys.readouterr().out.splitlines()
        mine = next(i for i, line in enumerate(lines) if line.startswith(f"your run ({sft_file} as written): "))
        assert "mb=8x1 len=128 ckpt adafactor lora64" in lines[mine] and verdict in lines[mine]
        assert mine < next(i for i, line in enumerate(lines) if line.startswith("predicted peak"))


def test_fit_takes_the_file_too(tmp_path, sft_file, monkeypatch):
    seen = []

    def capture(spec, rungs=None, factory=None, callback=None):
        seen.append(spec)
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "run_search", capture)
    with pytest.raises(KeyboardInterrupt):
        autofit.fit("sft", config=str(sft_file), device="cpu", gpu_memory="1GiB", out_dir=tmp_path / "out",
                    training_args={"learning_rate": 1e-4})
    (spec,) = seen
    assert spec.options.model == "tiny-qwen2" and spec.baseline is not None
    assert spec.baseline.get("optim") == "adafactor"
    assert spec.user_args == {"learning_rate": 1e-4, "weight_decay": 0.05}  # the keyword over the file, key by key


# -- real searches on the CPU meter ----------------------------------------------------------------------------
def search(path: Path, out: Path, budget: str, *extra: str) -> int:
    return cli.main(["search", "--config", str(path), "--device", "cpu", "--gpu-memory", budget, "--verify-steps",
                     "3", "--out", str(out), "-q", *extra])


@pytest.mark.slow
def test_a_budget_that_holds_the_run_gives_back_the_file_unchanged(tmp_path, sft_file):
    assert search(sft_file, tmp_path / "out", "1GiB") == 0
    best = json.loads((tmp_path / "out" / "best.json").read_text())
    # What this CPU machine needs to load and run it (issue 36, item 2): the bundled model's checkpoint, use_cpu, bf16
    machine = {"model_name_or_path", "use_cpu", "bf16"}
    assert best["rungs"] == [] and {change["key"] for change in best["changes"]} == machine
    text = (tmp_path / "out" / "best.yaml").read_text()
    header = [line for line in text.splitlines(keepends=True) if line.startswith("# ")][:3]
    body = [line for line in text[len("".join(header)):].splitlines(keepends=True)
            if line.split(":", 1)[0] not in machine]
    mine = [line for line in SFT.splitlines(keepends=True) if not line.startswith("model_name_or_path:")]
    assert body == mine  # the rest of the user's file, every byte, under autofit's three lines
    assert header[2].startswith("# use: trl sft --config best.yaml") and "--dataset_name" not in header[2]


@pytest.mark.slow
def test_a_tight_budget_changes_only_what_fitting_needs(tmp_path, sft_file):
    assert search(sft_file, tmp_path / "out", "300MiB") == 0
    best = json.loads((tmp_path / "out" / "best.json").read_text())
    path = tmp_path / "out" / "best.yaml"
    text = path.read_text()
    changed = {change["key"]: change for change in best["changes"]}
    assert changed and set(changed) <= {"per_device_train_batch_size", "gradient_accumulation_steps",
                                        "gradient_checkpointing", "activation_checkpointing", "dtype", "optim",
                                        "use_peft", "load_in_8bit", "load_in_4bit", "max_length",
                                        "model_name_or_path", "use_cpu", "bf16"}  # the last three: this CPU's
    for line in text.splitlines():  # every change says what it was and why; the rest is the user's text
        key = line.split(":", 1)[0]
        if key in changed:
            assert "# autofit: " in line and changed[key]["why"] in line
    assert "learning_rate: 3.0e-5    # tuned" in text and "weight_decay: 0.05" in text
    training, model = trl_reads(path, "sft", tmp_path)
    assert training.learning_rate == 3e-5 and training.weight_decay == 0.05
    assert (model.lora_r, model.lora_target_modules) == (64, ["q_proj", "v_proj"])
    if "optim" not in changed:
        assert training.optim == "adafactor"
    assert training.per_device_train_batch_size * training.gradient_accumulation_steps == 8  # the effective batch
    assert training.per_device_train_batch_size == best["config"]["per_device_train_batch_size"] < 8


@pytest.mark.slow
def test_a_grpo_file_keeps_its_rewards_and_generations(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text(GRPO)
    assert search(path, tmp_path / "out", "100MiB", "--algo", "grpo", "--max-prompt-length", "16") == 0
    text = (tmp_path / "out" / "best.yaml").read_text()
    assert "reward_funcs: [think_format_reward]" in text and "num_generations: 4" in text
    assert "# use: trl grpo --config best.yaml\n" in text  # the file names its data and its rewards
    training, _ = trl_reads(tmp_path / "out" / "best.yaml", "grpo", tmp_path)
    assert training.num_generations == 4 and training.learning_rate == 1e-6 and training.max_completion_length == 16
    assert training.per_device_train_batch_size * training.gradient_accumulation_steps == 8
    assert training.generation_batch_size % training.num_generations == 0


def test_the_config_option_is_documented():
    commands = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    for name in ("search", "estimate"):
        assert "your TRL config file" in commands[name].format_help()




@pytest.mark.slow
def test_a_files_own_deepspeed_config_runs_in_the_probe_and_the_ledger_sizes_its_buffers(tmp_path):
    path = tmp_path / "ds.yaml"
    path.write_text(DEEPSPEED)
    out = tmp_path / "out"
    code = cli.main(["search", "--config", str(path), "--device", "cpu", "--gpu-memory", "150MiB", "--max-probes", "1",
                     "--out", str(out)])
    probe = json.loads((out / "best.json").read_text())["candidates"][0]
    assert code == 0 and probe["outcome"] == "OK", probe  # launched as TRL's CLI would: one process of a world of 1
    assert abs(probe["prior_predicted_bytes"] - probe["peak_bytes"]) < 0.02 * probe["peak_bytes"]


def test_autofits_engines_beside_the_files_own_are_quality_levels_that_replace_it(tmp_path, capsys):
    path = tmp_path / "ds.yaml"
    path.write_text(DEEPSPEED)
    assert cli.main(["estimate", "--config", str(path), "--gpu-memory", "24GB", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert ("rungs fsdp2, zero3, optimizer-offload, fsdp2-offload, zero3-offload would replace your launch's DeepSpeed "
            "ZeRO-2 (deepspeed:) with autofit's engine: quality levels, climbed after the rungs that keep your engine")\
        in out  # zero1 and zero2 shard no more than the file's ZeRO-2: not climbed
    rows = [line.split()[1] for line in out.splitlines() if line[:5].strip().isdigit()]
    assert rows[-5:] == ["+fsdp2", "+zero3", "+optimizer-offload", "+fsdp2-offload", "+zero3-offload"]
    assert "+zero1" not in rows and "+zero2" not in rows and "+quant-4bit" in rows[:-5]
    assert "(+zero3): replaces your launch's DeepSpeed ZeRO-2 (deepspeed:) with DeepSpeed ZeRO-3" in out
