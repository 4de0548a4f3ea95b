"""The files and the launch of the engine that offloads optimizer states: DeepSpeed ZeRO-2 through accelerate.

A probe of an offloading candidate runs under the environment that ``accelerate launch --config_file
accelerate.yaml`` gives its process (derived here by accelerate's own launch code from the very file the export
writes), so what was measured is what the user launches. No torch here: the search process reads this too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from pathlib import Path
from typing import Dict, Optional

from autofit.files import atomic_write_text

ZERO2_OFFLOAD = "zero2-offload"
ENGINES = (ZERO2_OFFLOAD,)
DEEPSPEED_JSON = "deepspeed.json"
ACCELERATE_YAML = "accelerate.yaml"
MARKER = "# written by autofit:"


def deepspeed_missing() -> Optional[str]:
    """Why the engine cannot run here; None when it can."""
    if importlib.util.find_spec("deepspeed") is None:
        return "DeepSpeed is not installed (pip install 'trl-autofit[deepspeed]')"
    return None


def deepspeed_config(device: str = "cuda") -> Dict:
    """ZeRO-2 with the optimizer (fp32 master weights, gradients, Adam states) in host memory. "auto" values are
    filled by transformers' Trainer from the TRL config (batch, accumulation, clipping, bf16) and from the model
    (the gradient bucket: hidden size squared; DeepSpeed's own default is 5e8 elements, a 1 GB buffer in bf16).
    On the simulated (CPU) device the step runs torch's AdamW on the host partition instead of DeepSpeed's CPU Adam:
    the same states in the same place, without compiling DeepSpeed's C++ kernel (half a minute) for a step whose
    speed means nothing there."""
    config = {
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "contiguous_gradients": True,
            "overlap_comm": False,
            "reduce_bucket_size": "auto",
        },
        "bf16": {"enabled": "auto"},
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }
    if device == "cpu":
        config["zero_force_ds_cpu_optimizer"] = False
    return config


def accelerate_config(deepspeed_json: Path) -> Dict:
    """One process on this machine, DeepSpeed configured by the JSON beside it (TRL's accelerate configs' form)."""
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": str(deepspeed_json), "zero3_init_flag": False},
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": 1,
        "num_processes": 1,
        "use_cpu": False,
    }


def write_engine_files(folder: Path, engine: str, device: str = "cuda") -> Dict[str, Path]:
    """Write the DeepSpeed JSON and the accelerate config for ``engine`` into ``folder``; their paths by role."""
    import yaml

    if engine not in ENGINES:
        raise ValueError(f"unknown offload engine '{engine}': accepted are {', '.join(ENGINES)}")
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    ds_path, acc_path = folder / DEEPSPEED_JSON, folder / ACCELERATE_YAML
    atomic_write_text(ds_path, json.dumps(deepspeed_config(device), indent=2) + "\n")
    atomic_write_text(acc_path, f"{MARKER} optimizer offload ({engine}), DeepSpeed config in {DEEPSPEED_JSON}\n"
                      + yaml.safe_dump(accelerate_config(ds_path), sort_keys=False))
    return {"deepspeed": ds_path, "accelerate": acc_path}


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


def launch_env(accelerate_yaml: Path, device: str) -> Dict[str, str]:
    """The environment ``accelerate launch --config_file accelerate_yaml`` gives its single process: accelerate's
    DeepSpeed variables (from accelerate's launch code itself) plus torch.distributed's rank variables."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    args = launch_command_parser().parse_args(["--config_file", str(accelerate_yaml), "probe"])
    args, defaults, mixed_precision_from_config = _validate_launch_command(args)
    fields = list(defaults.deepspeed_config) if defaults else []
    args.deepspeed_fields_from_accelerate_config = ",".join(fields + (["mixed_precision"] * mixed_precision_from_config))
    args.main_process_port = free_port()
    _, env = prepare_deepspeed_cmd_env(args)
    changed = {key: value for key, value in env.items() if key.startswith("ACCELERATE_") and os.environ.get(key) != value}
    changed.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(args.main_process_port))
    if device == "cpu":  # the simulated device: DeepSpeed's CPU accelerator, whatever GPUs the machine has
        changed.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    return changed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_line(algo: str, best_yaml: Path, accelerate_yaml: Path) -> str:
    """The command that trains the exported configuration under the engine it was probed with."""
    return f"trl {algo} --config {best_yaml} --accelerate_config {accelerate_yaml}"
