"""TRL's GRPO and RLOO configs read at the launch's world size (issue 59, item 3): ``__post_init__`` computes the
generation batch as per-device batch x processes x steps per generation and checks it against ``num_generations``;
a file written for four processes was refused at the one process the search's reader runs in."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import refused_in_one_line as _refused

from autofit import cli
from autofit.core import InputError
from autofit.launch import read_launch

FOUR = """model_name_or_path: tiny-qwen2
max_completion_length: 16
per_device_train_batch_size: 1
num_generations: 2
"""


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "grpo.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("algo", ["grpo", "rloo"])
def test_the_doors_gpus_are_the_processes_trl_checks_the_generation_batch_at(tmp_path, algo):
    launch = read_launch({"config": _file(tmp_path, FOUR), "algo": algo, "gpus": 4})
    assert launch.file is not None and launch.file.training["generation_batch_size"] == 4
    assert launch.file.training["steps_per_generation"] == 1  # the four completions are one step's, over 4 ranks
    two_nodes = read_launch({"config": _file(tmp_path, FOUR), "algo": algo, "gpus": 2, "nodes": 2})
    assert two_nodes.file is not None and two_nodes.file.training["generation_batch_size"] == 4


@pytest.mark.parametrize("where", ["file", "trl flag", "accelerate flag"])
def test_the_launchs_own_num_processes_is_the_world_trl_reads_the_file_in(tmp_path, where):
    if where == "file":
        values = {"config": _file(tmp_path, FOUR + "num_processes: 4\n")}
    elif where == "trl flag":
        values = {"config": _file(tmp_path, FOUR), "launch_args": ["--num_processes", "4"]}
    else:
        values = {"config": _file(tmp_path, FOUR), "launch_args": ["--", "--num_processes=4"]}
    launch = read_launch({**values, "algo": "grpo"})
    assert launch.file is not None and launch.file.training["generation_batch_size"] == 4
    assert launch.engine.processes == 4


def test_the_doors_gpus_go_over_the_files_processes_as_trl_would_refuse_them(tmp_path):
    config = _file(tmp_path, FOUR + "num_processes: 4\n")
    with pytest.raises(InputError) as refused:
        read_launch({"config": config, "algo": "grpo", "gpus": 3})
    message = str(refused.value)
    assert "generation_batch_size (3) must be divisible by num_generations (2)" in message
    assert "in each of the launch's 3 processes" in message and "\n" not in message


def test_one_process_is_refused_in_trls_own_words(tmp_path, capsys):
    config = _file(tmp_path, FOUR)
    err = _refused(capsys, ["estimate", "--config", config, "--algo", "grpo", "--gpu-memory", "24GiB"])
    assert "generation_batch_size (1) must be divisible by num_generations (2)." in err
    assert "processes" not in err  # at one process TRL's message is the whole story


def test_a_four_gpu_grpo_file_is_estimated_as_the_user_types_it(tmp_path, capsys):
    config = _file(tmp_path, FOUR)
    code = cli.main(["estimate", "--config", config, "--algo", "grpo", "--gpus", "4", "--gpu-memory", "RTX3090"])
    out = capsys.readouterr()
    assert code == 0, out.err[-1500:]
    first = out.out.splitlines()[0]
    assert "over 4 GPUs" in first and "effective batch 4" in first
