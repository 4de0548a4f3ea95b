"""One engine, three doors: every option is declared once (``SearchOptions``), ``autofit search``, ``autofit estimate``
and ``autofit.fit`` are derived from it and reach the same validated question, and the Makefile's user targets call
the CLI."""
import inspect
import subprocess
from pathlib import Path

import pytest

import autofit
from autofit import _api as api
from autofit import cli
from autofit.core import InputError
from autofit.core._options import ESTIMATE, FIELDS, FIT, SEARCH, SearchOptions, door_fields, flag, options_from_args

REPO = Path(__file__).resolve().parents[2]
# Options that are the CLI's own (--json: the answer printed as a document; fit() returns it) or fit()'s positional
# argument.
CLI_ONLY = {"help", "version", "command", "factory", "as_json"}


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
    for name in door_fields(FIT):  # fit's defaults are the declared ones; the command line parses to the same
        default = parameters[name].default
        assert default == FIELDS[name].default, name  # model too: None, when --config names it
    assert SearchOptions(model="m") == options_from_args(search_parser().parse_args(["--model", "m"]), SEARCH)


def test_both_command_lines_are_derived_from_the_declaration():
    commands = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    for door, parser in ((SEARCH, commands["search"]), (ESTIMATE, commands["estimate"])):
        actions = {action.dest: action for action in parser._actions if action.dest in FIELDS}
        assert list(actions) == door_fields(door), door  # every option of the door, in declaration order
        for name, action in actions.items():
            help_text = FIELDS[name].metadata["estimate_help"] if door == ESTIMATE else None
            assert action.help == (help_text or FIELDS[name].metadata["help"]), name
            assert action.option_strings[-1] == flag(name) or FIELDS[name].metadata["doors"] == {FIT}, name


def test_estimate_refuses_what_search_refuses(capsys):
    # The drift the declaration ends: both command lines read a value with its field's kind and the same message.
    for command in ("search", "estimate"):
        argv = [command, "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--algo", "grpo",
                "--beta", "nan"]
        assert cli.main(argv) == 2
        assert capsys.readouterr().err.strip() == ("autofit: error: --beta 'nan' is not valid: a finite number, 0 or "
                                                   "more, is accepted")


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
    assert from_fit.ladder == ("micro-batch", "lora") and from_fit.user_args == {"beta": 0.1}


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
    assert captured[0].ladder == ("lora",)


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


def test_make_train_takes_the_demos_answer_when_only_the_demo_ran(tmp_path):
    """Issue 36, item 1: after `make demo`, `make train DATASET=DIR` (no OUT) trains on the demo's best.yaml; a
    search's answer comes first; OUT=dir is always what is named; with none, one line says what to run."""
    make = ["make", "-s", "-f", str(REPO / "Makefile"), "VENV=/nonexistent", "-o", "/nonexistent/.installed"]

    def dry(*args):
        return subprocess.run(make + ["-n", "train", "DATASET=chat", *args], cwd=tmp_path, capture_output=True,
                              text=True).stdout

    missing = subprocess.run(make + ["train", "DATASET=chat"], cwd=tmp_path, capture_output=True, text=True)
    assert missing.returncode == 2 and "run make search (or make demo) first" in missing.stderr
    (tmp_path / "autofit-out" / "demo").mkdir(parents=True)
    (tmp_path / "autofit-out" / "demo" / "best.yaml").write_text("{}\n")
    assert "--config autofit-out/demo/best.yaml --dataset_name chat --output_dir autofit-out/demo/train" in dry()
    assert "--config mine/best.yaml" in dry("OUT=mine")
    (tmp_path / "autofit-out" / "search").mkdir()
    (tmp_path / "autofit-out" / "search" / "best.yaml").write_text("{}\n")
    assert "--config autofit-out/search/best.yaml" in dry()


@pytest.mark.slow
def test_fit_leaves_optunas_verbosity_as_it_found_it(tmp_path, monkeypatch):
    """Issue 30, item 13: fit(quiet=True) left Optuna at WARNING (INFO before): the report, drawn after the search
    had put the caller's verbosity back, read the study at WARNING and left it there. Returned or raised, fit() leaves
    it as found (the second search reuses the first one's stored probes)."""
    import optuna

    found = optuna.logging.get_verbosity()
    options = dict(model="tiny-qwen2", device="cpu", gpu_memory="1GiB", max_length=16, effective_batch=2,
                   verify_steps=3, out_dir=tmp_path)
    try:
        for level, quiet in ((optuna.logging.INFO, True), (optuna.logging.DEBUG, False)):
            optuna.logging.set_verbosity(level)
            result = autofit.fit("sft", quiet=quiet, **options)
            assert result.report_html.is_file()  # the report was drawn from the study
            assert optuna.logging.get_verbosity() == level, quiet

        def interrupted(spec, rungs=None, factory=None, callback=None):
            raise KeyboardInterrupt

        monkeypatch.setattr(api, "run_search", interrupted)
        with pytest.raises(KeyboardInterrupt):
            autofit.fit("sft", quiet=True, **options)
        assert optuna.logging.get_verbosity() == optuna.logging.DEBUG
    finally:
        optuna.logging.set_verbosity(found)


CHAT = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("Name a primary colour.", "Red is a primary colour."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What does a thermometer measure?", "A thermometer measures temperature."),
]


@pytest.mark.slow
def test_the_readmes_demo_then_train_trains_on_text(tmp_path):
    """Issue 31, item 2: `make demo`, then `make train` on a few rows of real text. The demo's best.yaml names a
    random-weight checkpoint of the toy model; its tokenizer must read text (the probes' word-level one read every
    string as unknown tokens)."""
    import json
    import sys

    from transformers import AutoTokenizer

    venv = Path(sys.executable).parent.parent  # this interpreter's environment; -o: never reinstalled here
    # Issue 36, item 1: the README's words exactly, `make demo` then `make train DATASET=DIR` with no OUT, in a
    # folder of its own (a fresh clone has no autofit-out/search to take instead).
    make = ["make", "-f", str(REPO / "Makefile"), f"VENV={venv}", "-o", f"{venv}/.installed"]
    data, trained = tmp_path / "chat", tmp_path / "autofit-out" / "demo" / "train"
    done = subprocess.run(make + ["demo"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    data.mkdir()
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in CHAT]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows * 2))

    done = subprocess.run(make + ["train", f"DATASET={data}", "ARGS=--max_steps 1 --report_to none --save_strategy no"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "make train: autofit-out/demo/best.yaml" in done.stdout
    logged = [json.loads(line.strip().replace("'", '"')) for line in (done.stdout + done.stderr).replace("\r", "\n")
              .splitlines() if line.strip().startswith("{'train_runtime'")]
    assert logged and float(logged[0]["num_tokens"]) > 0 and float(logged[0]["epoch"]) > 0
    tokenizer = AutoTokenizer.from_pretrained(trained)
    ids = tokenizer(CHAT[0][1])["input_ids"]
    assert len(set(ids)) > 5 and tokenizer.decode(ids) == CHAT[0][1]  # text, not a row of unknown tokens
