"""The three doors of a launch (issue 39, item 1): ``--config`` (the TRL file), ``--accelerate-config`` (an accelerate
YAML, as ``accelerate launch --config_file`` reads it) and ``-- <your launch>`` (the command a user already runs, read
with TRL's parser and TRL's and accelerate's names). The same launch through any door is the same question; a launch
or file autofit cannot read is one line, exit 2; a DeepSpeed launch is estimated where DeepSpeed is not installed and
refused by the search before any probe (exit 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import at_door_values

from autofit import cli
from autofit.cli._main import build_parser
from autofit.core import ESTIMATE, SEARCH, SearchOptions, given_values
from autofit.launch import COMMANDS, read_command, split_launch, trl_command_names
from autofit.launch._accelerate_file import DISTRIBUTED_TYPES
from autofit.memory_model import base_candidate
from autofit.search import estimate_question, question

REPO = Path(__file__).resolve().parents[2]
TINY = """model_name_or_path: tiny-qwen2
max_length: 64
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 3.0e-5    # tuned
"""
BIG = """model_name_or_path: Qwen/Qwen2.5-7B
max_length: 1024
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
gradient_checkpointing: false
"""
FSDP = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_offload_params: {offload}
  fsdp_reshard_after_forward: true
  fsdp_activation_checkpointing: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
mixed_precision: {precision}
num_machines: 1
num_processes: 4
"""


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _values(argv, door=SEARCH):
    """The option values a command line gives, launch included, as ``autofit.cli`` reads them."""
    own, launch = split_launch(argv)
    args = build_parser().parse_args(own)
    launched = read_command(launch) if launch is not None else {}
    return at_door_values({**launched, **given_values(args, door)})


def _search_spec(argv):
    return question(SearchOptions(**_values(argv)))


def _estimated(argv):
    return base_candidate(estimate_question(SearchOptions(**_values(["estimate", *argv], ESTIMATE))))


def test_a_trl_launch_is_the_same_question_as_its_config_file(tmp_path):
    path = _write(tmp_path, "sft.yaml", TINY)
    common = ["search", "--device", "cpu", "--gpu-memory", "300MiB", "--out", str(tmp_path / "out")]
    by_file = _search_spec([*common, "--config", path])
    by_launch = _search_spec([*common, "--", "trl", "sft", "--config", path])
    assert by_launch == by_file  # the same options, baseline, budget and training arguments
    assert by_launch.study_name() == by_file.study_name() and by_launch.question_key() == by_file.question_key()
    assert by_file.baseline is not None and by_file.baseline.micro_batch == 4


def test_the_launchs_flags_override_its_file_as_trl_reads_them(tmp_path):
    path = _write(tmp_path, "sft.yaml", TINY)
    spec = _search_spec(["search", "--device", "cpu", "--gpu-memory", "300MiB", "--", "trl", "sft", "--config",
                         path, "--per_device_train_batch_size", "2", "--learning-rate", "1e-4", "--max_length=32"])
    assert spec.options.launch_args == ("--per_device_train_batch_size", "2", "--learning-rate", "1e-4",
                                        "--max_length=32")
    assert spec.baseline is not None and (spec.baseline.micro_batch, spec.baseline.grad_accum) == (2, 2)
    assert spec.options.effective_batch == 4 and spec.max_length == 32  # parsed by TRL: ints, over the file's
    assert spec.user_args["learning_rate"] == 1e-4
    user = spec.launch.file  # what later stages (best.yaml) read: the file with the launch's flags
    assert "per_device_train_batch_size: 2" in user.text and "max_length: 32" in user.text
    assert "# tuned" in user.text and user.written["learning_rate"] == 1e-4
    other = _search_spec(["search", "--device", "cpu", "--gpu-memory", "300MiB", "--config", path])
    assert other.study_name() != spec.study_name()  # another run, another study


def test_autofits_own_flags_before_the_dashes_override_the_launch(tmp_path):
    path = _write(tmp_path, "sft.yaml", BIG)
    fsdp = _write(tmp_path, "fsdp.yaml", FSDP.format(offload="false", precision="bf16"))
    launch = ["--", "accelerate", "launch", "--num_processes", "8", "--config_file", fsdp, "-m", "trl", "sft",
              "--config", path]
    candidate = _estimated(["--gpu-memory", "80GiB", *launch])
    assert candidate.sharding == "fsdp2" and candidate.ranks == 8  # accelerate's option over its file's 4
    assert candidate.checkpointing  # the FSDP plugin's activation checkpointing: the baseline's
    assert _estimated(["--gpu-memory", "80GiB", "--gpus", "2", *launch]).ranks == 2
    # accelerate's own options are accelerate's, even where TRL's parser has a field of the same name (--debug,
    # --gradient_accumulation_steps; transformers 4's --fsdp_min_num_params): the file's accumulation stays
    accelerate = _estimated(["--gpu-memory", "80GiB", "--", "accelerate", "launch", "--debug",
                             "--gradient_accumulation_steps", "4", "--num_processes", "2", "-m", "trl", "sft",
                             "--config", path])
    assert (accelerate.micro_batch, accelerate.grad_accum, accelerate.ranks) == (2, 1, 2)
    zero3 = _write(tmp_path, "z3.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n")
    assert _estimated(["--gpu-memory", "80GiB", "--gpus", "2", "--accelerate-config", zero3, *launch]).sharding \
        == "zero3"
    assert _estimated(["--gpu-memory", "80GiB", "--gpus", "2", "--", "trl", "sft", "--config", path,
                       "--accelerate_config", "zero3"]).sharding == "zero3"  # TRL's name, resolved by TRL's code


def test_the_door_s_accelerate_config_wins_over_the_files(tmp_path, capsys):
    path = _write(tmp_path, "sft.yaml", BIG + "accelerate_config: zero3\n")
    fsdp = _write(tmp_path, "fsdp.yaml", FSDP.format(offload="true", precision="bf16"))
    assert _estimated(["--gpu-memory", "80GiB", "--config", path, "--gpus", "4"]).sharding == "zero3"
    candidate = _estimated(["--gpu-memory", "80GiB", "--config", path, "--accelerate-config", fsdp])
    assert candidate.sharding == "fsdp2-offload" and candidate.ranks == 4
    assert cli.main(["estimate", "--model", "Qwen/Qwen2.5-7B", "--gpu-memory", "80GiB", "--accelerate-config",
                     fsdp]) == 0  # the accelerate file alone: its engine, processes and checkpointing
    line = capsys.readouterr().out.split("your run (", 1)[1].splitlines()[0]
    assert line.startswith(f"{fsdp} as written): mb=2x1x4 len=1024 fsdp2-offload ckpt")


def test_a_deepspeed_plugin_and_the_json_it_names_are_the_engine(tmp_path):
    path = _write(tmp_path, "sft.yaml", BIG)
    ds = _write(tmp_path, "ds.json", json.dumps({"zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}, "train_micro_batch_size_per_gpu": "auto"}))
    plugin = _write(tmp_path, "ds.yaml", f"distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: "
                                         f"{ds}\n  zero3_init_flag: false\nnum_processes: 2\n")
    candidate = _estimated(["--gpu-memory", "80GiB", "--config", path, "--accelerate-config", plugin])
    assert candidate.offload == "zero2-offload" and candidate.ranks == 2  # the optimizer-offload engine
    both = _write(tmp_path, "z3.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n"
                                       "  offload_optimizer_device: cpu\n  offload_param_device: cpu\n")
    assert _estimated(["--gpu-memory", "80GiB", "--config", path, "--accelerate-config", both]).sharding \
        == "zero3-offload"
    flags = _estimated(["--gpu-memory", "80GiB", "--", "accelerate", "launch", "--use_deepspeed", "--zero_stage",
                        "3", "--num_processes=2", "-m", "trl", "sft", "--config", path])
    assert flags.sharding == "zero3" and flags.ranks == 2  # accelerate's own options, read by accelerate's parser


def test_mixed_precision_is_the_runs_only_where_its_training_arguments_turn_theirs_off(tmp_path):
    fp16 = _write(tmp_path, "fp16.yaml", FSDP.format(offload="false", precision="fp16"))
    off = _write(tmp_path, "off.yaml", BIG + "bf16: false\n")
    values = _values(["estimate", "--gpu-memory", "80GiB", "--config", off, "--accelerate-config", fp16], ESTIMATE)
    assert values["training_args"]["fp16"] is True  # as transformers takes the launcher's where bf16/fp16 are off
    on = _write(tmp_path, "on.yaml", BIG)
    values = _values(["estimate", "--gpu-memory", "80GiB", "--config", on, "--accelerate-config", fp16], ESTIMATE)
    assert "fp16" not in values.get("training_args", {})  # TRL's bf16 (on by default) wins over the launcher's


@pytest.mark.parametrize("launch, named", [
    (["python", "train.py"], "'python train.py' cannot be read"),
    (["torchrun", "--nproc_per_node", "2", "train.py"], "'torchrun --nproc_per_node' cannot be read"),
    (["trl", "vllm-serve", "--model", "m"], "trl vllm-serve trains nothing autofit searches"),
    (["trl", "sfft", "--config", "sft.yaml"], "'sfft' is not a command of trl"),
    (["trl", "sft", "--learning_rate", "1e-4"], "'trl sft' has no --config FILE"),
    (["accelerate", "launch", "train.py"], "'accelerate launch train.py' runs no trl command"),
    ([], "nothing after --"),
])
def test_a_launch_autofit_cannot_read_is_one_line_naming_it(launch, named, capsys):
    assert cli.main(["estimate", "--gpu-memory", "80GiB", "--", *launch]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and err.startswith("autofit: error: ")
    if launch:
        assert "accepted are trl <command> --config FILE" in err


def test_a_missing_config_in_the_launch_is_one_line(tmp_path, capsys):
    missing = str(tmp_path / "nope.yaml")
    assert cli.main(["search", "--device", "cpu", "--gpu-memory", "300MiB", "--", "trl", "sft", "--config",
                     missing]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--config {missing}: cannot be read" in err


@pytest.mark.parametrize("text, named", [
    (None, "no such file, and not one of TRL's accelerate configs (fsdp1, fsdp2"),
    ("a: [\n", "not YAML accelerate can read"),
    ("- FSDP\n", "a YAML mapping"),
    ("distributed_type: FSDP3\n", "distributed_type 'FSDP3' is not one accelerate knows: accepted are NO,"),
    ("num_processes: 2\n", "distributed_type None is not one accelerate knows"),
    ("x: '" + "y" * (1 << 20) + "'\n", "larger than 1024 KiB"),
])
def test_an_accelerate_config_autofit_cannot_read_is_one_line(tmp_path, capsys, text, named):
    path = str(tmp_path / "acc.yaml")
    if text is not None:
        Path(path).write_text(text, encoding="utf-8")
    assert cli.main(["estimate", "--model", "Qwen/Qwen2.5-7B", "--gpu-memory", "80GiB", "--accelerate-config",
                     path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"autofit: error: --accelerate-config {path}: ") and named in err


def test_the_names_autofit_keeps_are_the_installed_packages():
    accelerate = pytest.importorskip("accelerate.utils")
    assert set(DISTRIBUTED_TYPES) == {kind.value for kind in accelerate.DistributedType}
    assert set(COMMANDS) <= set(trl_command_names())


HIDE_DEEPSPEED = '''import importlib.machinery, sys

class _Without:
    """PathFinder as it is where deepspeed is not installed: no module spec, no distribution metadata."""
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "deepspeed" or name.startswith("deepspeed."):
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)
    @staticmethod
    def find_distributions(*args, **kwargs):
        return (d for d in importlib.machinery.PathFinder.find_distributions(*args, **kwargs)
                if (d.metadata["Name"] or "").lower() != "deepspeed")
    @staticmethod
    def invalidate_caches():
        importlib.machinery.PathFinder.invalidate_caches()

sys.meta_path[:] = [_Without if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
'''


def _without_deepspeed(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """``autofit ARGV`` in a Python where DeepSpeed is not installed (hidden from every import and from the package
    metadata, in every process it starts: TRL's parser's included)."""
    folder = tmp_path / "no-deepspeed"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(HIDE_DEEPSPEED, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(REPO)])}
    check = subprocess.run([sys.executable, "-c", "import importlib.util as u, importlib.metadata as m\n"
                            "assert u.find_spec('deepspeed') is None\ntry:\n m.version('deepspeed')\nexcept "
                            "m.PackageNotFoundError:\n print('hidden')"], env=env, capture_output=True, text=True)
    assert check.stdout.strip() == "hidden", check.stderr
    return subprocess.run([sys.executable, "-m", "autofit.cli", *argv], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)


DEEPSPEED_BLOCK = """deepspeed:
  zero_optimization:
    stage: 2
    offload_optimizer:
      device: cpu
"""


def test_a_deepspeed_launch_is_estimated_where_deepspeed_is_not_installed(tmp_path):
    path = _write(tmp_path, "ds.yaml", BIG + DEEPSPEED_BLOCK)
    done = _without_deepspeed(tmp_path, "estimate", "--config", path, "--gpu-memory", "80GiB")
    assert done.returncode == 0, done.stderr
    line = done.stdout.split("your run (", 1)[1].splitlines()[0]
    assert "host memory (pinned RAM)" in line and "PackageNotFoundError" not in done.stderr
    fsdp = _write(tmp_path, "fsdp.yaml", BIG + 'fsdp: "full_shard auto_wrap"\nfsdp_config:\n  fsdp_version: 2\n')
    done = _without_deepspeed(tmp_path, "estimate", "--config", fsdp, "--gpus", "4", "--gpu-memory", "80GiB")
    assert done.returncode == 0 and "fsdp2" in done.stdout.split("your run (", 1)[1].splitlines()[0], done.stderr


def test_the_search_of_a_deepspeed_launch_says_it_needs_deepspeed_before_any_probe(tmp_path):
    path = _write(tmp_path, "ds.yaml", TINY + DEEPSPEED_BLOCK)
    out = tmp_path / "out"
    done = _without_deepspeed(tmp_path, "search", "--config", path, "--device", "cpu", "--gpu-memory", "300MiB",
                              "--out", str(out))
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("\n") == 1 and "runs DeepSpeed, which is not installed here" in done.stderr
    assert "probe" not in done.stdout and not (out / "probes").exists()
    zero3 = _write(tmp_path, "z3.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n")
    done = _without_deepspeed(tmp_path, "search", "--model", "tiny-qwen2", "--accelerate-config", zero3, "--device",
                              "cpu", "--gpu-memory", "300MiB", "--out", str(out))
    assert done.returncode == 4 and f"{zero3}'s engine (zero3) runs DeepSpeed" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_search_through_the_launch_writes_the_launch_as_best_yaml(tmp_path):
    path = _write(tmp_path, "sft.yaml", TINY)
    out = tmp_path / "out"
    code = cli.main(["search", "--device", "cpu", "--gpu-memory", "1GiB", "--verify-steps", "3", "--out", str(out),
                     "-q", "--", "trl", "sft", "--config", path, "--per_device_train_batch_size", "2",
                     "--weight_decay", "0.05"])
    assert code == 0
    text = (out / "best.yaml").read_text()
    assert "per_device_train_batch_size: 2" in text and "weight_decay: 0.05" in text and "# tuned" in text
    best = json.loads((out / "best.json").read_text())
    assert best["request"]["launch_args"] == ["--per_device_train_batch_size", "2", "--weight_decay", "0.05"]


def test_fit_takes_the_accelerate_config_too(tmp_path, monkeypatch):
    import autofit
    from autofit import _api as api

    seen = []

    def capture(spec, rungs=None, factory=None, callback=None):
        seen.append(spec)
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "run_search", capture)
    fsdp = _write(tmp_path, "fsdp.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
                                         "  fsdp_activation_checkpointing: true\nnum_processes: 1\n")
    with pytest.raises(KeyboardInterrupt):
        autofit.fit("sft", model="tiny-qwen2", accelerate_config=fsdp, device="cpu", gpu_memory="1GiB",
                    out_dir=tmp_path / "out")
    (spec,) = seen
    assert spec.baseline is not None and (spec.baseline.sharding, spec.baseline.get("checkpointing")) == ("fsdp2", True)
    assert spec.options.accelerate_config == fsdp and spec.ranks == 1


def test_the_files_own_accelerate_config_is_read_with_the_same_limits(tmp_path, capsys):
    bad = _write(tmp_path, "acc.yaml", "distributed_type: FSDP2\n")
    path = _write(tmp_path, "sft.yaml", BIG + f"accelerate_config: {bad}\n")
    assert cli.main(["estimate", "--config", path, "--gpu-memory", "80GiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"accelerate_config {bad}: distributed_type 'FSDP2' is not one accelerate" in err


@pytest.mark.parametrize("flag", [["--accelerate_config=zero9"], ["--accelerate_config", "zero9"]])
def test_a_bad_accelerate_config_in_the_launch_is_named_as_the_user_typed_it(tmp_path, capsys, flag):
    path = _write(tmp_path, "sft.yaml", BIG)
    assert cli.main(["estimate", "--gpu-memory", "80GiB", "--", "trl", "sft", "--config", path, *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trl sft --accelerate_config zero9: no such file" in err
    assert "--accelerate-config" not in err


def test_two_different_files_at_the_door_and_in_the_launch_are_one_line(tmp_path, capsys):
    one, other = _write(tmp_path, "one.yaml", BIG), _write(tmp_path, "other.yaml", BIG)
    for command in ("estimate", "search"):
        assert cli.main([command, "--gpu-memory", "80GiB", "--config", one, "--", "trl", "sft", "--config",
                         other]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--config {one} and the launch's --config {other} differ: give one" in err
    assert cli.main(["estimate", "--gpu-memory", "80GiB", "--accelerate-config", "zero2", "--", "trl", "sft",
                     "--config", one, "--accelerate_config", "zero3"]) == 2
    assert "--accelerate-config zero2 and the launch's accelerate config zero3 differ" in capsys.readouterr().err
    same = str(tmp_path / "." / "one.yaml")  # the same file, written another way: one question
    assert cli.main(["estimate", "--gpu-memory", "80GiB", "--config", same, "--", "trl", "sft", "--config", one]) == 0
