"""The engine of the user's launch as TRL and accelerate read it (issue 39, items 1-2): ``fsdp:``/``fsdp_config:``
in the file, ``accelerate_config:`` (TRL's names) and ``num_processes:``, and a DeepSpeed block that offloads the
optimizer, each estimated as that engine, never as plain data parallel or as if it did not offload."""

from __future__ import annotations

from pathlib import Path

from fakes import at_door_values

from autofit import cli
from autofit.core import SearchOptions
from autofit.launch import read_launch
from autofit.memory_model import base_candidate, phase_ledgers
from autofit.search import estimate_question

MODEL = "Qwen/Qwen2.5-7B"
COMMON = f"""model_name_or_path: {MODEL}
max_length: 1024
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
gradient_checkpointing: true
"""


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sft.yaml"
    path.write_text(COMMON + text, encoding="utf-8")
    return str(path)


def _candidate(path: str, **given):
    values = at_door_values({"config": path, "gpu_memory": 80 * 2**30, "device": "cuda", **given})
    return base_candidate(estimate_question(SearchOptions(**values)))


def _peak(candidate):
    return max(ledger.total for ledger in phase_ledgers(candidate, device="cuda"))


def test_fsdp_keys_of_the_training_arguments_are_estimated_as_fsdp_not_data_parallel(tmp_path, capsys):
    path = _file(tmp_path, 'fsdp: "full_shard auto_wrap"\nfsdp_config:\n  fsdp_version: 2\n'
                           "  reshard_after_forward: true\n  activation_checkpointing: false\n")
    candidate = _candidate(path, gpus=4)
    assert candidate.sharding == "fsdp2" and candidate.ranks == 4
    plain = candidate.replace(sharding=None)  # what the file was estimated as before: data parallel
    assert _peak(candidate) < 0.5 * _peak(plain)
    assert cli.main(["estimate", "--config", path, "--gpus", "4", "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "fsdp2" in out.split("your run", 1)[1].splitlines()[0]
    assert "FSDP config of your own" not in out  # modelled, not a guess
    offloaded = _candidate(_file(tmp_path, 'fsdp: "full_shard offload auto_wrap"\n'), gpus=4)
    assert offloaded.sharding == "fsdp2-offload"


def test_accelerate_config_fsdp2_and_num_processes_are_taken_as_trl_takes_them(tmp_path, capsys):
    path = _file(tmp_path, "accelerate_config: fsdp2\nnum_processes: 4\n")
    engine = read_launch({"config": path, "algo": "sft"}).engine
    assert engine.sharding == "fsdp2" and engine.processes == 4
    candidate = _candidate(path)
    assert candidate.sharding == "fsdp2" and candidate.ranks == 4  # the file's processes: four GPUs
    assert _candidate(path, gpus=2).ranks == 2  # a flag at the door overrides the file, as in TRL
    assert cli.main(["estimate", "--config", path, "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "over 4 GPUs" in out and "fsdp2" in out.split("your run", 1)[1].splitlines()[0]
    zero3 = _candidate(_file(tmp_path, "accelerate_config: zero3\n"), gpus=8)
    assert zero3.sharding == "zero3" and zero3.ranks == 8
    assert _candidate(_file(tmp_path, "accelerate_config: multi_gpu\n"), gpus=2).sharding is None
    assert cli.main(["estimate", "--config", _file(tmp_path, "accelerate_config: no-such-engine\n"),
                     "--gpu-memory", "80GiB"]) == 2
    assert "no-such-engine" in capsys.readouterr().err


def test_a_deepspeed_block_that_offloads_the_optimizer_is_modelled_as_offload(tmp_path, capsys):
    block = ("bf16: true\ndeepspeed:\n  zero_optimization:\n    stage: 2\n{offload}"
             "  bf16:\n    enabled: true\n")
    offloading = _candidate(_file(tmp_path, block.format(offload="    offload_optimizer:\n      device: cpu\n")))
    resident = _candidate(_file(tmp_path, block.format(offload="")))
    ledgers = phase_ledgers(offloading, device="cuda")
    assert all(ledger.optimizer == 0 for ledger in ledgers)  # Adam's states live on the host
    assert ledgers[0].host > 0 and _peak(offloading) < 0.6 * _peak(resident)
    path = _file(tmp_path, block.format(offload="    offload_optimizer:\n      device: cpu\n"))
    assert cli.main(["estimate", "--config", path, "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    line = out.split("your run", 1)[1].splitlines()[0]
    assert "host memory (pinned RAM)" in line and "fits in" in line
    assert "that offloads (its host buffers are not modelled)" not in out


def test_an_accelerate_plugin_maps_onto_the_engine_and_the_launchs_options_override_it():
    from autofit.launch import launch_engine

    v1 = {"path": "fsdp.yaml", "values": {"distributed_type": "FSDP", "num_processes": 4, "fsdp_config": {
        "fsdp_version": 1, "fsdp_sharding_strategy": 2, "fsdp_auto_wrap_policy": "NO_WRAP"}}}
    engine = launch_engine({}, {}, {}, v1)
    assert engine.sharding == "fsdp2" and engine.processes == 4 and not engine.checkpointing
    said = " ".join(engine.notes)  # what the ledger does not model is said, never silently dropped
    assert "version 1" in said and "shard_grad_op" in said and "NO_WRAP" in said
    launched = launch_engine({}, {}, {"use_deepspeed": True, "zero_stage": 3, "offload_optimizer_device": "cpu",
                                      "offload_param_device": "cpu", "num_processes": 2}, v1)
    assert launched.sharding == "zero3-offload" and launched.processes == 2  # accelerate's options over its file
    no_shard = launch_engine({}, {}, {}, {"path": "x.yaml", "values": {"distributed_type": "FSDP", "fsdp_config": {
        "fsdp_sharding_strategy": "NO_SHARD", "fsdp_activation_checkpointing": True}, "mixed_precision": "fp16"}})
    assert no_shard.sharding is None and no_shard.checkpointing and no_shard.mixed_precision == "fp16"
    megatron = launch_engine({}, {}, {}, {"path": "m.yaml", "values": {"distributed_type": "MEGATRON_LM"}})
    assert megatron.sharding is None and "Megatron-LM of accelerate config m.yaml is not modelled" in megatron.notes[0]
    partial = launch_engine({}, {}, {}, {"path": "p.yaml", "values": {"distributed_type": "DEEPSPEED",
                                                                      "deepspeed_config": {"zero_stage": 3,
                                                                      "offload_param_device": "cpu"}}})
    assert partial.sharding == "zero3" and "offloading only the parameters" in partial.notes[0]
