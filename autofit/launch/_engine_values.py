"""A launch's engine values checked against what accelerate and DeepSpeed accept, as the launch is read and before
any probe: one line naming the key, its value, what is accepted and where it was written. ``autofit.launch._engine``
then maps only values the engines would run.

Accepted, as the engines take them: a ZeRO stage 0-3 (DeepSpeed's ``ZeroStageEnum``; accelerate's ``zero_stage``
goes to it through an environment variable, so a quoted ``'3'`` there is a stage, and ``true`` is not); an offload
device ``none`` or ``cpu``; a count of processes or machines a whole number from 1 (accelerate's ``int``; a boolean
is not a count here, as YAML would have it) up to ``MAX_PROCESSES``.

Decision: NVMe offload, which DeepSpeed also runs, is refused with the way on. autofit models neither the disk's room
nor its speed, and mapping it onto its own offload engine would answer, and export, CPU offload for a run the user
launches with NVMe.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from autofit.core import InputError

ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD_DEVICES = ("none", "cpu")
MAX_PROCESSES = 65536  # far beyond any cluster a search is run for; 10**30 is a typo, not a cluster
COUNT_KEYS = ("num_processes", "num_machines")
MIXED_PRECISIONS = ("no", "fp16", "bf16", "fp8")  # accelerate's PrecisionType
FSDP_VERSIONS = (1, 2)
# accelerate's FSDP sharding strategies, by name and by number (its config files write either)
FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
FSDP_BOOLEANS = ("fsdp_offload_params", "fsdp_activation_checkpointing", "fsdp_cpu_ram_efficient_loading",
                 "fsdp_use_orig_params", "fsdp_sync_module_states")  # reshard_after_forward: a bool or a strategy
_TRUTH = ("true", "false", "1", "0", "yes", "no")  # what accelerate's str_to_bool takes (and y/n, on/off, t/f)
# accelerate's DeepSpeed plugin keys and the DeepSpeed JSON's blocks that name an offload device
PLUGIN_OFFLOADS = ("offload_optimizer_device", "offload_param_device")
JSON_OFFLOADS = ("offload_optimizer", "offload_param")


def _refuse(where: str, key: str, value: Any, accepted: str) -> InputError:
    return InputError(f"{where}: {key} = {value!r} is not accepted: {accepted}")


def zero_stage(value: Any) -> Any:
    """accelerate's ``zero_stage`` as DeepSpeed gets it (``int`` of the text accelerate launch passes on)."""
    text = str(value).strip()
    return int(text) if not isinstance(value, bool) and text in {str(stage) for stage in ZERO_STAGES} else value


def check_zero_stage(value: Any, key: str, where: str) -> None:
    if isinstance(value, bool) or value not in ZERO_STAGES:
        raise _refuse(where, key, value, "a ZeRO stage DeepSpeed runs, 0, 1, 2 or 3")


def check_offload_device(value: Any, key: str, where: str) -> None:
    device = str(value).lower()
    if device == "nvme":
        raise _refuse(where, key, value, "none or cpu here: autofit does not model NVMe offload (the disk's room and "
                                         "speed); search with cpu, whose memory on the GPU is NVMe's, and switch back")
    if not isinstance(value, str) or device not in OFFLOAD_DEVICES:
        raise _refuse(where, key, value, "an offload device, none or cpu")


def check_count(value: Any, key: str, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PROCESSES:
        raise _refuse(where, key, value, f"a whole number from 1 to {MAX_PROCESSES}")


def _check_fsdp(plugin: Mapping[str, Any], where: str) -> None:
    version = plugin.get("fsdp_version")
    if version is not None and (isinstance(version, bool) or version not in FSDP_VERSIONS):
        raise _refuse(where, "fsdp_config.fsdp_version", version, "1 or 2, the FSDP versions accelerate runs")
    strategy = plugin.get("fsdp_sharding_strategy")
    if strategy is not None and str(strategy).upper() not in FSDP_STRATEGIES \
            and str(strategy) not in {str(n) for n in range(1, len(FSDP_STRATEGIES) + 1)}:
        raise _refuse(where, "fsdp_config.fsdp_sharding_strategy", strategy, f"one of {', '.join(FSDP_STRATEGIES)}")
    for key in FSDP_BOOLEANS:
        value = plugin.get(key)
        if value is not None and not isinstance(value, bool) \
                and str(value).strip().lower() not in _TRUTH + ("y", "n", "on", "off", "t", "f"):
            raise _refuse(where, f"fsdp_config.{key}", value, "true or false")


def check_accelerate_values(values: Mapping[str, Any], where: str) -> None:
    """An accelerate config's counts, mixed precision, and its plugins' values: the DeepSpeed plugin's stage and
    offload devices, the FSDP plugin's version, sharding strategy and switches (absent keys take accelerate's
    defaults, which are accepted)."""
    for key in COUNT_KEYS:
        if values.get(key) is not None:
            check_count(values[key], key, where)
    precision = values.get("mixed_precision")
    if precision is not None and str(precision).lower() not in MIXED_PRECISIONS:
        raise _refuse(where, "mixed_precision", precision, f"one of {', '.join(MIXED_PRECISIONS)}")
    for block in ("deepspeed_config", "fsdp_config"):
        if values.get(block) is not None and not isinstance(values[block], dict):
            raise _refuse(where, block, values[block], "a mapping of the plugin's settings")
    if isinstance(values.get("fsdp_config"), dict):
        _check_fsdp(values["fsdp_config"], where)
    plugin = values.get("deepspeed_config")
    if not isinstance(plugin, dict):
        return
    if plugin.get("zero_stage") is not None:
        check_zero_stage(zero_stage(plugin["zero_stage"]), "deepspeed_config.zero_stage", where)
    for key in PLUGIN_OFFLOADS:
        if plugin.get(key) is not None:
            check_offload_device(plugin[key], f"deepspeed_config.{key}", where)


def check_deepspeed_config(values: Dict[str, Any], where: str) -> None:
    """A DeepSpeed configuration's ZeRO stage and offload devices (a JSON file, or a TRL file's ``deepspeed``)."""
    zero = values.get("zero_optimization")
    if zero is None:
        return
    if not isinstance(zero, dict):
        raise _refuse(where, "zero_optimization", zero, "a mapping of ZeRO settings (stage, offload_optimizer, ...)")
    if "stage" in zero:
        check_zero_stage(zero["stage"], "zero_optimization.stage", where)
    for block in JSON_OFFLOADS:
        settings = zero.get(block)
        if settings is not None and not isinstance(settings, dict):
            raise _refuse(where, f"zero_optimization.{block}", settings,
                          "a mapping such as {device: cpu} (DeepSpeed's offload settings)")
        if isinstance(settings, dict) and settings.get("device") is not None:
            check_offload_device(settings["device"], f"zero_optimization.{block}.device", where)
