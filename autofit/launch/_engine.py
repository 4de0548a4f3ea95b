"""The engine of the user's launch, as TRL and accelerate read it: the training arguments' ``fsdp``/``fsdp_config``
(how TrainingArguments take FSDP), else the accelerate config the launch names (``accelerate_config: fsdp2`` in the
file, TRL's names or a path, resolved by TRL's own code in ``autofit.probe._trl_config``), and the launch's
``num_processes``/``num_machines``. Mapped onto the candidate's engine at the ladder's first level, so the memory
model's FSDP2 and ZeRO ledgers apply to the run as the user launches it.

Decisions, where the launch says more than the ledger models: FSDP version 1 (flat parameters) is modelled as FSDP2's
per-parameter shards (the same bytes per rank, said in a note); ``shard_grad_op`` / ``reshard_after_forward: false``
likewise (FSDP2 keeps the unsharded weights between forward and backward then: said, not modelled); FSDP over a
4-bit base shards the bitsandbytes storage as the PEFT guide runs QLoRA under FSDP (``bnb_4bit_quant_storage`` a
float dtype). A DeepSpeed block in the file stays the training argument ``deepspeed`` (the ledger reads its stage,
buckets and offload, ``autofit.memory_model``); an accelerate DeepSpeed plugin maps to the ZeRO stage it names (its
``deepspeed_config_file`` JSON's stage and offload devices where it names one). ``accelerate launch``'s own options
(``--use_fsdp``, ``--zero_stage``, ``--mixed_precision``, ``--num_processes``, ...) override its config file's, as
accelerate merges them. FSDP's activation checkpointing is the checkpointing the baseline starts with; the accelerate
config's mixed precision is the run's only where the training arguments turn both bf16 and fp16 off (transformers'
``TrainingArguments`` take their own ``bf16``, on by TRL's default, over the launcher's).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from autofit.core import LaunchEngine, engine_for
from autofit.launch._accelerate_file import read_accelerate_config, read_deepspeed_json, zero_settings
from autofit.launch._accelerate_keys import accelerate_notes
from autofit.launch._engine_values import (
    COUNT_KEYS,
    PLUGIN_OFFLOADS,
    check_count,
    check_offload_device,
    check_zero_stage,
    zero_stage,
)

FSDP_STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2")


# FSDP version 1's sharding strategies by number, as accelerate's config files may write them
_STRATEGY_NUMBERS = {"1": "full_shard", "2": "shard_grad_op", "3": "no_shard", "4": "hybrid_shard",
                     "5": "hybrid_shard_zero2"}
# accelerate launch's options that override its config file's plugin settings (accelerate's names)
_DEEPSPEED_OPTIONS = ("zero_stage", "offload_optimizer_device", "offload_param_device", "deepspeed_config_file")
ACCELERATE_DEFAULT_STAGE = 2  # accelerate.utils.DeepSpeedPlugin: ACCELERATE_DEEPSPEED_ZERO_STAGE, else 2
_OTHER_TYPES = {"MEGATRON_LM": "Megatron-LM", "XLA": "XLA (TPU)"}


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes") if not isinstance(value, bool) else value


def _fsdp_items(written: Any, parsed: Any) -> List[str]:
    """The ``fsdp`` training argument's items (a string, a list, or transformers 5's bool)."""
    for value in (written, parsed):
        if isinstance(value, str) and value.strip():
            return value.lower().split()
        if isinstance(value, (list, tuple)) and value:
            return [str(item).lower().split(".")[-1] for item in value]
    return ["full_shard"] if parsed is True or written is True else []


def _fsdp_from_args(training: Dict[str, Any], written: Dict[str, Any]) -> Optional[LaunchEngine]:
    items = _fsdp_items(written.get("fsdp"), training.get("fsdp"))
    if not items or items == ["no_shard"]:
        return None
    config = {**(training.get("fsdp_config") or {})}
    config.update({k[5:] if k.startswith("fsdp_") else k: v for k, v in (written.get("fsdp_config") or {}).items()})
    offload = "offload" in items or _truthy(config.get("cpu_offload", False)) \
        or _truthy(config.get("offload_params", False))
    notes = _fsdp_notes(config.get("version", 2), items, config.get("reshard_after_forward", True))
    return LaunchEngine(sharding=engine_for(fsdp=True, parameters=offload), source="fsdp: " + " ".join(items),
                        notes=notes, checkpointing=_truthy(config.get("activation_checkpointing", False)))


def _fsdp_notes(version: Any, items: List[str], reshard: Any, wrap: Any = None) -> Tuple[str, ...]:
    notes = []
    if str(version) == "1":
        notes.append("FSDP version 1 (flat parameters) modelled as FSDP2's per-parameter shards")
    if "shard_grad_op" in items or "hybrid_shard_zero2" in items or str(reshard).lower() in ("false", "shard_grad_op"):
        notes.append("FSDP without resharding after forward (shard_grad_op) modelled as full shard")
    if str(wrap).upper() == "NO_WRAP":
        notes.append("fsdp_auto_wrap_policy NO_WRAP (the whole model one FSDP unit, gathered at once) modelled as "
                     "wrapping each decoder layer")
    return tuple(notes)


def _fsdp_plugin(fsdp: Dict[str, Any], name: str) -> LaunchEngine:
    strategy = str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")).lower()
    strategy = _STRATEGY_NUMBERS.get(strategy, strategy)
    checkpointing = _truthy(fsdp.get("fsdp_activation_checkpointing", False))
    if strategy == "no_shard":
        return LaunchEngine(source=name, checkpointing=checkpointing)
    offload = _truthy(fsdp.get("fsdp_offload_params", False))
    notes = _fsdp_notes(fsdp.get("fsdp_version", 1), [strategy], fsdp.get("fsdp_reshard_after_forward", True),
                        fsdp.get("fsdp_auto_wrap_policy"))
    return LaunchEngine(sharding=engine_for(fsdp=True, parameters=offload), source=name, notes=notes,
                        checkpointing=checkpointing)


def _deepspeed_plugin(ds: Dict[str, Any], name: str) -> LaunchEngine:
    stage, optimizer, param = zero_stage(ds.get("zero_stage")), ds.get("offload_optimizer_device", "none"), \
        ds.get("offload_param_device", "none")
    if ds.get("deepspeed_config_file"):  # accelerate takes the JSON's settings over the plugin's then
        values = ds.get("deepspeed_config_file_values") or read_deepspeed_json(
            str(ds["deepspeed_config_file"]), f"{name}: deepspeed_config_file")
        stage, optimizer, param = zero_settings(values)
        name += f" ({ds['deepspeed_config_file']})"
    elif stage is None:  # accelerate's DeepSpeedPlugin runs ZeRO-2 where neither the file nor the launch says
        stage = ACCELERATE_DEFAULT_STAGE
    if stage not in (1, 2, 3):
        return LaunchEngine(source=name, notes=(f"the DeepSpeed plugin of {name} (ZeRO stage 0: no ZeRO) is "
                                                "modelled as data parallel",))
    offloads = [str(device).lower() not in ("none", "") for device in (optimizer, param)]
    sharding = engine_for(stage, optimizer=offloads[0], parameters=offloads[1])
    notes: Tuple[str, ...] = ()
    if stage == 3 and any(offloads) and not all(offloads):
        notes = (f"ZeRO-3 offloading only the {'optimizer' if offloads[0] else 'parameters'} modelled without "
                 "offload",)
    return LaunchEngine(sharding=sharding, source=name, notes=notes)


def _from_accelerate(values: Dict[str, Any], name: str) -> LaunchEngine:
    kind = str(values.get("distributed_type", "")).upper()
    if kind == "FSDP":
        engine = _fsdp_plugin(values.get("fsdp_config") or {}, name)
    elif kind == "DEEPSPEED":
        engine = _deepspeed_plugin(values.get("deepspeed_config") or {}, name)
    elif kind in _OTHER_TYPES:
        engine = LaunchEngine(source=name, notes=(f"{_OTHER_TYPES[kind]} of {name} is not modelled (estimated as "
                                                  "data parallel)",))
    else:
        engine = LaunchEngine(source=name)
    precision = values.get("mixed_precision")
    return LaunchEngine(sharding=engine.sharding, source=engine.source,
                        notes=engine.notes + tuple(accelerate_notes(values, name)),
                        checkpointing=engine.checkpointing,
                        mixed_precision=str(precision).lower() if precision is not None else None)


def _overlay(values: Dict[str, Any], launch: Dict[str, Any]) -> Dict[str, Any]:
    """The accelerate config as ``accelerate launch`` runs it: the launch's own options over the file's."""
    merged = dict(values)
    for flag, kind in (("use_deepspeed", "DEEPSPEED"), ("use_fsdp", "FSDP"), ("use_megatron_lm", "MEGATRON_LM")):
        if launch.get(flag):
            merged["distributed_type"] = kind
    deepspeed = {key: launch[key] for key in _DEEPSPEED_OPTIONS if launch.get(key) is not None}
    if deepspeed:
        merged["deepspeed_config"] = {**(merged.get("deepspeed_config") or {}), **deepspeed}
    fsdp = {key: value for key, value in launch.items() if key.startswith("fsdp_") and value is not None}
    if fsdp:
        merged["fsdp_config"] = {**(merged.get("fsdp_config") or {}), **fsdp}
    if launch.get("mixed_precision") is not None:
        merged["mixed_precision"] = launch["mixed_precision"]
    return merged


def _check_launch_options(launch: Dict[str, Any]) -> None:
    """``accelerate launch``'s own engine options, named as the user typed them."""
    for key in COUNT_KEYS:
        if launch.get(key) is not None:
            check_count(launch[key], f"--{key}", "accelerate launch")
    if launch.get("zero_stage") is not None:
        check_zero_stage(launch["zero_stage"], "--zero_stage", "accelerate launch")
    for key in PLUGIN_OFFLOADS:
        if launch.get(key) is not None:
            check_offload_device(launch[key], f"--{key}", "accelerate launch")


def launch_engine(training: Dict[str, Any], written: Dict[str, Any], launch: Dict[str, Any],
                  door_file: Optional[Dict[str, Any]] = None) -> LaunchEngine:
    """The engine, processes and machines the user's launch runs (the training arguments' FSDP first, as the
    Trainer's FSDP plugin is built from them whatever accelerate's file says). ``door_file``: the accelerate config
    given at autofit's door (``--accelerate-config``), which wins over the file's ``accelerate_config``."""
    _check_launch_options(launch)
    config = door_file or launch.get("config_file") or {}
    if config.get("path") and "values" not in config:  # the launch's own (the file's accelerate_config, a flag's)
        key = "accelerate_config" if written.get("accelerate_config") else "--config_file"
        config = read_accelerate_config(str(config["path"]), where=key)
    values: Dict[str, Any] = config["values"] if isinstance(config.get("values"), dict) else {}
    if door_file:
        name = f"accelerate config {door_file['path']}"
    elif written.get("accelerate_config"):
        name = f"accelerate_config: {written['accelerate_config']}"
    else:
        name = f"accelerate config {config.get('path', '')}" if config else "accelerate launch"
    values = _overlay(values, launch)
    plugin = _from_accelerate(values, name) if values else LaunchEngine()
    engine = _fsdp_from_args(training, written) or plugin
    processes = launch.get("num_processes", values.get("num_processes"))
    machines = launch.get("num_machines", values.get("num_machines"))
    return LaunchEngine(sharding=engine.sharding, source=engine.source, notes=engine.notes,
                        processes=processes if isinstance(processes, int) and processes > 0 else None,
                        machines=machines if isinstance(machines, int) and machines > 0 else None,
                        checkpointing=engine.checkpointing or plugin.checkpointing,
                        mixed_precision=plugin.mixed_precision)
