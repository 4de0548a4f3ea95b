"""The files and the launch of the engines a probe can run under, through accelerate: DeepSpeed ZeRO-2 with the
optimizer offloaded to host memory (one GPU or several), DeepSpeed ZeRO stages 1 to 3 and FSDP2 across several
GPUs, and plain data parallel (DDP).

A probe runs under the environment that ``accelerate launch --config_file accelerate.yaml`` gives each of its
processes (derived here by accelerate's own launch code from the very file the export writes, plus the rank
variables torchrun sets), so what was measured is what the user launches. No torch here: the search process reads
this too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from pathlib import Path
from typing import Any, Dict, Optional

from autofit.core import ENGINES, engine_for
from autofit.machine import atomic_write_text

ZERO2_OFFLOAD = engine_for(2, optimizer=True)  # the optimizer-offload engine (``Candidate.offload``)
ZERO_STAGES = {name: engine.stage for name, engine in ENGINES.items() if engine.deepspeed}
FSDP_ENGINES = tuple(name for name, engine in ENGINES.items() if engine.fsdp)
DEEPSPEED_JSON = "deepspeed.json"
ACCELERATE_YAML = "accelerate.yaml"
MARKER = "# written by autofit:"


def deepspeed_missing() -> Optional[str]:
    """Why the engine cannot run here; None when it can."""
    if importlib.util.find_spec("deepspeed") is None:
        return "DeepSpeed is not installed (pip install 'trl-autofit[deepspeed]')"
    return None


def deepspeed_engine(given: Any) -> Optional[str]:
    """The engine of ours a user's ``deepspeed`` training argument (its dict, or the JSON file it names) runs:
    "zero1".."zero3", "zero2-offload" (ZeRO-1/2 with the optimizer on the CPU), "zero3-offload" (both offloads);
    None when it names no ZeRO stage or cannot be read (the ladder then takes it as sharding nothing)."""
    config = given
    if isinstance(given, str) and given:
        try:
            config = json.loads(Path(given).read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return None
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    stage = zero.get("stage") if isinstance(zero, dict) else None
    if stage not in (1, 2, 3):
        return None
    assert isinstance(zero, dict)
    offloads = [isinstance(zero.get(key), dict) and zero[key].get("device") not in (None, "none")
                for key in ("offload_optimizer", "offload_param")]
    return engine_for(stage, optimizer=offloads[0], parameters=offloads[1])


def deepspeed_config(device: str = "cuda", engine: str = ZERO2_OFFLOAD) -> Dict:
    """A ZeRO stage; ``zero2-offload``: ZeRO-2 with the optimizer (fp32 master weights, gradients, Adam states) in
    host memory. "auto" values are
    filled by transformers' Trainer from the TRL config (batch, accumulation, clipping, bf16) and from the model
    (the gradient bucket: hidden size squared; DeepSpeed's own default is 5e8 elements, a 1 GB buffer in bf16).
    On the simulated (CPU) device the step runs torch's AdamW on the host partition instead of DeepSpeed's CPU Adam:
    the same states in the same place, without compiling DeepSpeed's C++ kernel (half a minute) for a step whose
    speed means nothing there."""
    zero = {"stage": ZERO_STAGES[engine], "contiguous_gradients": True, "overlap_comm": False,
            "reduce_bucket_size": "auto"}
    if ENGINES[engine].offloads_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if ENGINES[engine].offloads_parameters:  # the weights' partitions too (ZeRO-Infinity to CPU)
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if ZERO_STAGES[engine] == 3:  # the Trainer fills these from the model's hidden size
        zero.update(stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto",
                    stage3_gather_16bit_weights_on_model_save=True)
    config = {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }
    if device == "cpu":
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def fsdp2_config(offload: bool = False) -> Dict:
    """FSDP2 full shard (TRL's ``fsdp2`` accelerate config): every layer sharded, gathered for its forward and
    backward; the model's own decoder layer class wraps (transformers' ``_no_split_modules``)."""
    return {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_cpu_ram_efficient_loading": True, "fsdp_offload_params": offload,
            "fsdp_reshard_after_forward": True, "fsdp_state_dict_type": "FULL_STATE_DICT"}


MAIN_NODE_PLACEHOLDER = "MAIN_NODE_IP"


def accelerate_config(engine: str, deepspeed_json: Optional[Path] = None, ranks: int = 1, device: str = "cuda",
                      nodes: int = 1) -> Dict:
    """``ranks`` processes on each of ``nodes`` machines under ``engine`` (TRL's accelerate configs' form). With
    several machines, each sets its own ``machine_rank`` and the main one's address."""
    config = {"compute_environment": "LOCAL_MACHINE", "machine_rank": 0, "main_training_function": "main",
              "num_machines": nodes, "num_processes": ranks * nodes, "use_cpu": False}
    if nodes > 1:
        config.update(main_process_ip=MAIN_NODE_PLACEHOLDER, main_process_port=29500, rdzv_backend="static",
                      same_network=True)
    if engine in ZERO_STAGES:
        config.update(distributed_type="DEEPSPEED", deepspeed_config={
            "deepspeed_config_file": str(deepspeed_json), "zero3_init_flag": ZERO_STAGES[engine] == 3})
    elif engine in FSDP_ENGINES:
        config.update(distributed_type="FSDP", fsdp_config=fsdp2_config(offload=ENGINES[engine].offloads_parameters))
    else:
        config.update(distributed_type="MULTI_CPU" if device == "cpu" else "MULTI_GPU", use_cpu=device == "cpu")
    return dict(sorted(config.items()))


def write_engine_files(folder: Path, engine: str, device: str = "cuda", ranks: int = 1, nodes: int = 1
                       ) -> Dict[str, Path]:
    """Write the accelerate config for ``engine`` (and the DeepSpeed JSON it points at) into ``folder``; their
    paths by role."""
    import yaml

    if engine not in ENGINES:
        raise ValueError(f"unknown engine '{engine}': accepted are {', '.join(ENGINES)}")
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    ds_path, acc_path = folder / DEEPSPEED_JSON, folder / ACCELERATE_YAML
    paths = {"accelerate": acc_path}
    if engine in ZERO_STAGES:
        atomic_write_text(ds_path, json.dumps(deepspeed_config(device, engine), indent=2) + "\n")
        paths["deepspeed"] = ds_path
    else:
        ds_path.unlink(missing_ok=True)
    what = f"optimizer offload ({engine})" if engine == ZERO2_OFFLOAD and ranks * nodes == 1 else \
        f"{engine} on {ranks} processes" + (f" on each of {nodes} machines (set machine_rank and main_process_ip "
                                            f"on each)" if nodes > 1 else "")
    atomic_write_text(acc_path, f"{MARKER} {what}" + (f", DeepSpeed config in {DEEPSPEED_JSON}" if engine in
                                                       ZERO_STAGES else "") + "\n"
                      + yaml.safe_dump(accelerate_config(engine, ds_path, ranks, device, nodes), sort_keys=False))
    return paths


def remove_stale_engine_files(folder: Path) -> None:
    """An earlier search's engine files, when this answer needs none (only files autofit wrote: a user's own
    accelerate config is kept)."""
    acc_path = Path(folder) / ACCELERATE_YAML
    try:
        ours = acc_path.read_text().startswith(MARKER)
    except OSError:
        return
    if ours:
        acc_path.unlink(missing_ok=True)
        (Path(folder) / DEEPSPEED_JSON).unlink(missing_ok=True)


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def rank_env(rank: int, ranks: int, port: int) -> Dict[str, str]:
    """What torchrun (``accelerate launch``'s launcher) gives rank ``rank`` of ``ranks`` processes on one machine."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def launch_env(accelerate_yaml: Path, device: str, engine: str = ZERO2_OFFLOAD) -> Dict[str, str]:
    """The environment ``accelerate launch --config_file accelerate_yaml`` gives one of its processes: accelerate's
    variables for ``engine`` (from accelerate's own launch code) plus torch.distributed's rank variables (this
    process's, when the runner set them; else those of a single process)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import (
        prepare_deepspeed_cmd_env,
        prepare_multi_gpu_env,
        prepare_simple_launcher_cmd_env,
    )

    args = launch_command_parser().parse_args(["--config_file", str(accelerate_yaml), "probe"])
    args, defaults, mixed_precision_from_config = _validate_launch_command(args)
    port = int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ else free_port()
    args.main_process_port = port
    if engine in ZERO_STAGES:
        fields = list(defaults.deepspeed_config) if defaults else []
        args.deepspeed_fields_from_accelerate_config = ",".join(fields + (["mixed_precision"] *
                                                                          mixed_precision_from_config))
        _, env = prepare_deepspeed_cmd_env(args)
    elif device == "cpu" and engine not in FSDP_ENGINES:  # FSDP: the GPU launcher's (autofit.rungs.engines._probe_fsdp)
        _, env = prepare_simple_launcher_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    changed = {key: value for key, value in env.items() if key.startswith(("ACCELERATE_", "FSDP_"))
               and os.environ.get(key) != value}
    changed.update(process_env(device, port))
    return changed


def process_env(device: str, port: int = 0) -> Dict[str, str]:
    """torch.distributed's variables of this process (the runner's, else those of a single process), and on the
    simulated device DeepSpeed's CPU accelerator: what a DeepSpeed run needs beside its configuration."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        env = {key: os.environ[key] for key in RANK_VARIABLES if key in os.environ}
    else:
        env = rank_env(0, 1, port or free_port())
    if device == "cpu":  # the simulated device: DeepSpeed's CPU accelerator, whatever GPUs the machine has
        env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_line(algo: str, best_yaml: Path, accelerate_yaml: Path) -> str:
    """The command that trains the exported configuration under the engine it was probed with (``trl`` hands
    ``--accelerate_config`` to ``accelerate launch``, which starts the config's ``num_processes``)."""
    return f"trl {algo} --config {best_yaml} --accelerate_config {accelerate_yaml}"
