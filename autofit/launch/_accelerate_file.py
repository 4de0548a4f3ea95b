"""The accelerate config file of the user's launch (``--accelerate-config FILE``, ``accelerate launch --config_file
FILE``, or one of TRL's names: ``zero3``, ``fsdp2``, ...), read in the search's process as ``accelerate launch`` reads
it, with the limits of the TRL file (``autofit.launch._config_file``: a regular file or a pipe, its size, its YAML
aliases, no key twice), and the DeepSpeed JSON its plugin names (``deepspeed_config_file``), read the same way.

accelerate's own loader imports torch, which the search's process never does: the file is YAML (or JSON, which YAML
reads) whose ``distributed_type`` must be one accelerate knows (``DISTRIBUTED_TYPES``; a test checks it against the
installed accelerate's ``DistributedType``). What the values mean for the engine is ``autofit.launch._engine``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import yaml

from autofit.core import InputError, one_line
from autofit.launch._config_file import read_config_text
from autofit.launch._engine_values import check_accelerate_values, check_deepspeed_config

FLAG = "--accelerate-config"
# accelerate's DistributedType values (accelerate.utils.DistributedType): what a config file's distributed_type takes
DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU",
                     "MULTI_HPU", "MULTI_NEURON", "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM")

def trl_names() -> Tuple[str, ...]:
    """The accelerate configs TRL ships (``trl <algo> --accelerate_config NAME``); none where this TRL has none."""
    try:
        import importlib.resources as resources

        folder = resources.files("trl.accelerate_configs")
        return tuple(sorted(item.name[:-5] for item in folder.iterdir() if item.name.endswith(".yaml")))
    except (ImportError, ModuleNotFoundError, FileNotFoundError, OSError):
        return ()


def resolve(value: str, where: str = FLAG) -> str:
    """The file a launch's accelerate config names: a path that exists, else one of TRL's names, resolved by TRL's own
    code as ``--accelerate_config`` is (a path first, as TRL does)."""
    try:
        if Path(value).exists():
            return value
    except OSError as exc:  # a name longer than the filesystem takes (ENAMETOOLONG)
        raise InputError(f"{where} {one_line(value)[:80]}...: not a path this system can open ({exc.strerror})") \
            from None
    if value in trl_names():
        from trl.cli.accelerate_config import resolve_accelerate_config_argument

        return str(resolve_accelerate_config_argument(["--accelerate_config", value])[1])
    names = ", ".join(trl_names()) or "none in this TRL"
    raise InputError(f"{where} {value}: no such file, and not one of TRL's accelerate configs ({names}); give the "
                     "path of your accelerate config YAML")


def _text(path: str, flag: str) -> str:
    try:
        return read_config_text(path)
    except InputError as exc:
        message = str(exc)
        raise InputError(flag + message[len("--config"):] if message.startswith("--config") else message) from None


def read_accelerate_config(value: str, where: str = FLAG) -> Dict[str, Any]:
    """``{"path", "values"}``: the file as accelerate reads it, its DeepSpeed JSON read into
    ``deepspeed_config["deepspeed_config_file_values"]``; ``InputError`` (one line naming the value, as ``where``
    names it, and what is accepted) for a missing, unreadable or non-YAML file or a ``distributed_type`` accelerate
    does not know, or an engine value accelerate or DeepSpeed does not take (``autofit.launch._engine_values``)."""
    path = resolve(value, where)
    text = _text(path, where)
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or one_line(exc)
        line = f", line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{where} {value}: not YAML accelerate can read ({problem}{line}); give an accelerate "
                         "config file (accelerate config writes one)") from None
    if not isinstance(values, dict):
        raise InputError(f"{where} {value}: an accelerate config file is a YAML mapping (distributed_type: FSDP, "
                         f"...), not {type(values).__name__}")
    kind = values.get("distributed_type")
    if str(kind) not in DISTRIBUTED_TYPES:
        raise InputError(f"{where} {value}: distributed_type {kind!r} is not one accelerate knows: accepted are "
                         f"{', '.join(DISTRIBUTED_TYPES)}")
    check_accelerate_values(values, f"{where} {value}")
    deepspeed = values.get("deepspeed_config")
    if isinstance(deepspeed, dict) and deepspeed.get("deepspeed_config_file"):
        deepspeed = {**deepspeed, "deepspeed_config_file_values": read_deepspeed_json(
            str(deepspeed["deepspeed_config_file"]), f"{where} {value}: deepspeed_config_file")}
        values = {**values, "deepspeed_config": deepspeed}
    return {"path": path, "values": values}


def read_deepspeed_json(path: str, where: str) -> Dict[str, Any]:
    """A DeepSpeed config file (JSON) a launch names, read with the same limits; its path as accelerate opens it
    (relative to the directory the launch runs in)."""
    text = _text(path, where)
    try:
        values = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{where} {path}: not JSON DeepSpeed can read ({one_line(exc)})") from None
    if not isinstance(values, dict):
        raise InputError(f"{where} {path}: a DeepSpeed config is a JSON object, not {type(values).__name__}")
    check_deepspeed_config(values, f"{where} {path}")
    return values


def zero_settings(values: Dict[str, Any]) -> Tuple[Optional[int], str, str]:
    """(ZeRO stage, optimizer offload device, parameter offload device) of a DeepSpeed JSON."""
    zero = values.get("zero_optimization") or {}
    stage = zero.get("stage") if isinstance(zero, dict) else None

    def device(key: str) -> str:
        block = zero.get(key) if isinstance(zero, dict) else None
        return str(block.get("device", "none")).lower() if isinstance(block, dict) else "none"

    return (stage if isinstance(stage, int) else None), device("offload_optimizer"), device("offload_param")


def check_deepspeed_argument(given: Any, path: str) -> None:
    """The file's ``deepspeed`` training argument: its mapping, or the JSON file it names where that can be read
    (one that cannot is left to the memory model's note, as TRL would read it on the training machine)."""
    where = f"--config {path}: deepspeed"
    if isinstance(given, dict):
        check_deepspeed_config(given, where)
    elif isinstance(given, str) and given and Path(given).is_file():
        read_deepspeed_json(given, where)
