"""The engines the offload and sharding rungs run (DeepSpeed ZeRO, FSDP2, data parallel across ranks): their accelerate
and DeepSpeed files and launch environment, written for the probes and the export alike (``_files``), and their probe
step (``_probe``, the child's: the engine entered before the trainer is built, FSDP2 on the simulated device's ranks,
the offloaded state read back)."""

from autofit.rungs.engines._files import (
    ACCELERATE_YAML,
    DEEPSPEED_JSON,
    ENGINES,
    FSDP_ENGINES,
    MAIN_NODE_PLACEHOLDER,
    MARKER,
    RANK_VARIABLES,
    ZERO2_OFFLOAD,
    ZERO_STAGES,
    accelerate_config,
    deepspeed_config,
    deepspeed_engine,
    deepspeed_missing,
    free_port,
    fsdp2_config,
    launch_env,
    launch_line,
    process_env,
    rank_env,
    remove_stale_engine_files,
    write_engine_files,
)

__all__ = [
    "ACCELERATE_YAML", "DEEPSPEED_JSON", "ENGINES", "FSDP_ENGINES", "MAIN_NODE_PLACEHOLDER", "MARKER",
    "RANK_VARIABLES", "ZERO2_OFFLOAD", "ZERO_STAGES",
    "accelerate_config", "deepspeed_config", "deepspeed_engine", "deepspeed_missing", "free_port", "fsdp2_config",
    "launch_env", "launch_line", "process_env", "rank_env", "remove_stale_engine_files", "write_engine_files",
]
