"""Issue 50, item 2: your engine is never silently replaced. An accelerate file's ``zero_stage: 4`` answered for a
plain run with exit 0, ``zero_stage: true`` invented an engine "zeroTrue", NVMe offload was exported as CPU offload,
a TRL file's ``deepspeed:`` with stage 4 failed after two probes, and ``num_processes: 2.5`` estimated one GPU. Every
engine value is now checked against what accelerate and DeepSpeed accept as the launch is read, before any probe:
one line naming the key, its value, what is accepted and where it was written; exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import refused_in_one_line

from autofit import cli

TRL_FILE = """model_name_or_path: tiny-qwen2
max_length: 64
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
"""
ESTIMATE = ["estimate", "--gpu-memory", "80GiB"]


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _refused(capsys, argv) -> str:
    return refused_in_one_line(capsys, argv, nothing_on_stdout=True)


@pytest.mark.parametrize("plugin,key,accepted", [
    ("  zero_stage: 4\n", "deepspeed_config.zero_stage = 4", "0, 1, 2 or 3"),
    ("  zero_stage: true\n", "deepspeed_config.zero_stage = True", "0, 1, 2 or 3"),
    ("  zero_stage: '4'\n", "deepspeed_config.zero_stage = '4'", "0, 1, 2 or 3"),
    ("  zero_stage: 3\n  offload_optimizer_device: nvme\n", "deepspeed_config.offload_optimizer_device = 'nvme'",
     "does not model NVMe offload"),
    ("  zero_stage: 3\n  offload_param_device: gpu\n", "deepspeed_config.offload_param_device = 'gpu'",
     "none or cpu"),
])
def test_an_accelerate_deepspeed_plugin_value_the_engines_refuse_is_named(tmp_path, capsys, plugin, key, accepted):
    accelerate = _write(tmp_path, "ds.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n" + plugin)
    config = _write(tmp_path, "sft.yaml", TRL_FILE)
    err = _refused(capsys, [*ESTIMATE, "--config", config, "--accelerate-config", accelerate])
    assert f"--accelerate-config {accelerate}: {key} is not accepted" in err and accepted in err


@pytest.mark.parametrize("value", ["2.5", "true", "0", "-2", str(10**30)])
def test_a_process_count_that_is_not_a_count_is_named(tmp_path, capsys, value):
    accelerate = _write(tmp_path, "multi.yaml", f"distributed_type: MULTI_GPU\nnum_processes: {value}\n")
    err = _refused(capsys, [*ESTIMATE, "--model", "tiny-qwen2", "--accelerate-config", accelerate])
    assert f"{accelerate}: num_processes = " in err and "a whole number from 1 to 65536" in err


def test_a_trl_files_deepspeed_block_with_a_stage_deepspeed_has_not_is_named(tmp_path, capsys):
    config = _write(tmp_path, "sft.yaml", TRL_FILE + "deepspeed:\n  zero_optimization:\n    stage: 4\n")
    err = _refused(capsys, [*ESTIMATE, "--config", config])
    assert f"--config {config}: deepspeed: zero_optimization.stage = 4 is not accepted" in err


@pytest.mark.parametrize("block", ["offload_optimizer", "offload_param"])
@pytest.mark.parametrize("as_json", [False, True])
def test_an_offload_written_as_a_device_not_a_mapping_is_named_not_trls_attribute_error(tmp_path, capsys, block,
                                                                                        as_json):
    zero = {"zero_optimization": {"stage": 3, block: "cpu"}}
    ds_json = tmp_path / "ds.json"
    ds_json.write_text(json.dumps(zero))
    config = _write(tmp_path, "sft.yaml", TRL_FILE + f"deepspeed: {ds_json if as_json else json.dumps(zero)}\n")
    err = _refused(capsys, [*ESTIMATE, "--config", config])
    where = f"{ds_json}" if as_json else f"--config {config}: deepspeed"
    assert f"{where}: zero_optimization.{block} = 'cpu' is not accepted: a mapping such as {{device: cpu}}" in err
    assert "AttributeError" not in err


def test_a_deepspeed_json_the_launch_names_is_checked_too(tmp_path, capsys):
    ds_json = tmp_path / "ds.json"
    ds_json.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}}))
    config = _write(tmp_path, "sft.yaml", TRL_FILE + f"deepspeed: {ds_json}\n")
    err = _refused(capsys, [*ESTIMATE, "--config", config])
    assert f"{ds_json}: zero_optimization.offload_optimizer.device = 'nvme'" in err
    accelerate = _write(tmp_path, "plugin.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                                 f"  deepspeed_config_file: {ds_json}\n")
    plain = _write(tmp_path, "plain.yaml", TRL_FILE)
    err = _refused(capsys, [*ESTIMATE, "--config", plain, "--accelerate-config", accelerate])
    assert "deepspeed_config_file" in err and "zero_optimization.offload_optimizer.device = 'nvme'" in err


def test_accelerate_launchs_own_options_are_named_as_typed(tmp_path, capsys):
    config = _write(tmp_path, "sft.yaml", TRL_FILE)
    err = _refused(capsys, [*ESTIMATE, "--", "accelerate", "launch", "--use_deepspeed", "--zero_stage", "4",
                            "-m", "trl", "sft", "--config", config])
    assert "accelerate launch: --zero_stage = 4 is not accepted" in err


def test_a_quoted_stage_is_the_stage_accelerate_passes_on(tmp_path):
    from autofit.launch import read_launch

    accelerate = _write(tmp_path, "ds.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: '3'\n")
    assert read_launch({"accelerate_config": accelerate}).engine.sharding == "zero3"


def test_values_the_engines_take_still_answer(tmp_path, capsys):
    accelerate = _write(tmp_path, "ds.yaml", "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                                             "  zero_stage: 0\n  offload_optimizer_device: none\n")
    config = _write(tmp_path, "sft.yaml", TRL_FILE + "deepspeed:\n  zero_optimization:\n    stage: 2\n"
                                                     "    offload_optimizer:\n      device: cpu\n")
    for argv in ([*ESTIMATE, "--config", config], [*ESTIMATE, "--model", "tiny-qwen2", "--accelerate-config",
                                                    accelerate]):
        assert cli.main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()


@pytest.mark.parametrize("text,key,accepted", [
    ("distributed_type: MULTI_GPU\nmixed_precision: bf17\n", "mixed_precision = 'bf17'", "no, fp16, bf16, fp8"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config: [1, 2]\n", "deepspeed_config = [1, 2]", "a mapping"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 3\n", "fsdp_config.fsdp_version = 3", "1 or 2"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_offload_params: yes please\n",
     "fsdp_config.fsdp_offload_params = 'yes please'", "true or false"),
    ("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HALF_SHARD\n",
     "fsdp_config.fsdp_sharding_strategy = 'HALF_SHARD'", "FULL_SHARD"),
])
def test_an_accelerate_value_accelerate_would_refuse_is_named(tmp_path, capsys, text, key, accepted):
    """A held-out hostile round found these answered with exit 0 (fsdp_version 3 as FSDP2, a strategy or a switch
    accelerate cannot read dropped, bf17 ignored) or blamed on the model (a list for the DeepSpeed plugin)."""
    accelerate = _write(tmp_path, "acc.yaml", text)
    err = _refused(capsys, [*ESTIMATE, "--model", "tiny-qwen2", "--accelerate-config", accelerate])
    assert f"{accelerate}: {key} is not accepted" in err and accepted in err


def test_trls_own_accelerate_configs_are_accepted():
    import importlib.resources as resources

    import yaml

    from autofit.launch._engine_values import check_accelerate_values

    names = [item for item in resources.files("trl.accelerate_configs").iterdir() if item.name.endswith(".yaml")]
    assert names
    for item in names:
        check_accelerate_values(yaml.safe_load(item.read_text()), item.name)


def test_a_name_longer_than_the_filesystem_takes_is_one_line(tmp_path, capsys):
    config = _write(tmp_path, "sft.yaml", TRL_FILE)
    err = _refused(capsys, [*ESTIMATE, "--config", config, "--accelerate-config", "a" * 300 + ".yaml"])
    assert "--accelerate-config aaaa" in err and "not a path this system can open" in err


def test_a_deepspeed_plugin_without_a_stage_runs_accelerates_default():
    """accelerate's DeepSpeedPlugin runs ZeRO-2 where no stage is given: it was estimated as plain data parallel,
    the CPU offload it names ignored."""
    from autofit.launch import launch_engine

    given = {"path": "acc.yaml", "values": {"distributed_type": "DEEPSPEED",
                                            "deepspeed_config": {"offload_optimizer_device": "cpu"}}}
    assert launch_engine({}, {}, {}, given).sharding == "zero2-offload"
    given["values"]["deepspeed_config"] = {}
    assert launch_engine({}, {}, {}, given).sharding == "zero2"
