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


def check_accelerate_values(values: Mapping[str, Any], where: str) -> None:
    """An accelerate config's counts and its DeepSpeed plugin's stage and offload devices (absent keys take
    accelerate's defaults, which are accepted)."""
    for key in COUNT_KEYS:
        if values.get(key) is not None:
            check_count(values[key], key, where)
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
        if isinstance(settings, dict) and settings.get("device") is not None:
            check_offload_device(settings["device"], f"zero_optimization.{block}.device", where)
