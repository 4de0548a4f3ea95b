"""One engine, three doors: every ``autofit search`` option is a keyword of ``autofit.fit`` with the same name and
meaning (derived from the parser, so the two cannot drift), both reach the same validated question, and the
Makefile's user targets call the CLI."""

import inspect
import subprocess
from pathlib import Path

import pytest

import autofit
from autofit import _api as api
from autofit import cli
from autofit.core import InputError

REPO = Path(__file__).resolve().parents[1]
# Options that are the CLI's own or fit()'s positional argument.
CLI_ONLY = {"help", "version", "command", "factory"}


def search_parser():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    return commands.choices["search"]


def cli_dests():
    return {action.dest for action in search_parser()._actions} - CLI_ONLY


def test_every_search_option_is_a_fit_keyword():
    parameters = inspect.signature(autofit.fit).parameters
    missing = sorted(cli_dests() - set(parameters))
    assert not missing, f"autofit search options without a fit() keyword: {missing}"
    defaults = {action.dest: action.default for action in search_parser()._actions if action.dest in cli_dests()}
    for name, default in defaults.items():
        if name in ("quiet", "real_weights"):  # store_true flags: False on both sides
            assert parameters[name].default is False
        elif name != "model":
            assert parameters[name].default == default, name


@pytest.fixture
def captured(monkeypatch):
    seen = []

    def capture(spec, rungs=None, factory=None, callback=None):
        seen.append(spec)
        raise KeyboardInterrupt  # stop before any probe; both doors handle it

    monkeypatch.setattr(api, "run_search", capture)
    return seen


def test_both_doors_ask_the_same_question(tmp_path, captured):
    argv = ["search", "--model", "tiny-qwen2", "--algo", "grpo", "--device", "cpu", "--gpu-memory", "1GiB",
            "--max-completion-length", "64", "--min-completion-length", "16", "--max-prompt-length", "32",
            "--num-generations", "4", "--beta", "0.1", "--effective-batch", "16", "--ladder", "micro-batch,lora",
            "--out", str(tmp_path), "--dtype", "bfloat16", "--verify-steps", "4", "--probe-timeout", "300",
            "--build-timeout", "60", "--max-probes", "7", "--headroom", "0.05", "--no-predict"]
    assert cli.main(argv) == 130
    with pytest.raises(KeyboardInterrupt):
        autofit.fit("grpo", model="tiny-qwen2", algo="grpo", device="cpu", gpu_memory="1GiB",
                    max_completion_length=64, min_completion_length=16, max_prompt_length=32, num_generations=4,
                    beta=0.1, effective_batch=16, ladder="micro-batch,lora", out_dir=tmp_path, dtype="bfloat16",
                    verify_steps=4, probe_timeout_s=300, build_timeout_s=60, max_probes=7, headroom=0.05,
                    predict=False)
    from_cli, from_fit = captured
    assert from_cli == from_fit
    assert from_fit.ladder == ["micro-batch", "lora"] and from_fit.user_args == {"beta": 0.1}


@pytest.mark.parametrize("kwargs, named", [
    (dict(gpu_memory=1.5), "1.5"),  # a float is not a size: '1.5GiB' is
    (dict(gpu_memory=1), "below 1 MiB"),
    (dict(algo="GRPO"), "'GRPO'"),  # the CLI's message: names are lower case
    (dict(ladder="lora,warp-drive"), "warp-drive"),  # a string is the CLI's comma-separated list, not letters
    (dict(beta=float("nan"), algo="grpo"), "nan"),
    (dict(probe_timeout_s=float("inf")), "inf"),
    (dict(training_args=["lr", 1e-4]), "training_args"),
])
def test_fit_validates_like_the_cli(tmp_path, captured, kwargs, named):
    options = dict(model="tiny-qwen2", device="cpu", gpu_memory="1GiB", out_dir=tmp_path)
    options.update(kwargs)
    with pytest.raises(InputError, match=named):
        autofit.fit("sft", **options)
    assert not captured


def test_a_string_ladder_is_split_like_the_cli(tmp_path, captured):
    with pytest.raises(KeyboardInterrupt):
        autofit.fit("sft", model="tiny-qwen2", device="cpu", gpu_memory="1GiB", out_dir=tmp_path, ladder="lora")
    assert captured[0].ladder == ["lora"]


def test_clashing_training_args_are_named_and_never_contradict(tmp_path, captured, caplog):
    with pytest.raises(KeyboardInterrupt):
        autofit.fit("sft", model="tiny-qwen2", device="cpu", gpu_memory="1GiB", out_dir=tmp_path,
                    training_args={"learning_rate": 1e-4, "gradient_checkpointing": True,
                                   "per_device_train_batch_size": 3})
    assert captured[0].user_args == {"learning_rate": 1e-4}
    assert "gradient_checkpointing" in caplog.text and "per_device_train_batch_size" in caplog.text


def test_fit_result_is_documented_and_short():
    assert api.FitResult.__doc__ and "best_yaml" in api.FitResult.__doc__
    assert (REPO / "autofit" / "py.typed").is_file()


def test_the_makefile_has_user_targets():
    done = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0
    for target in ("search", "estimate", "train", "demo", "test"):
        assert f"make {target}" in done.stdout
    dry = subprocess.run(["make", "-n", "search", "MODEL=Qwen/Qwen2.5-0.5B", "ALGO=grpo", "GPU_MEMORY=24GiB",
                          "FACTORY=my_trainers:make_trainer"], cwd=REPO, capture_output=True, text=True)
    assert "autofit search --model Qwen/Qwen2.5-0.5B --algo grpo --gpu-memory 24GiB" in dry.stdout
    assert "--factory my_trainers:make_trainer" in dry.stdout
    train = subprocess.run(["make", "-n", "train", "ALGO=sft", "DATASET=trl-lib/Capybara"], cwd=REPO,
                           capture_output=True, text=True)
    assert "trl sft --config" in train.stdout and "--dataset_name trl-lib/Capybara" in train.stdout
