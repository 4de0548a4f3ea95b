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
buckets and offload, ``autofit.memory_model``); an accelerate DeepSpeed plugin maps to the ZeRO stage it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

FSDP_STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2")


@dataclass(frozen=True)
class LaunchEngine:
    sharding: Optional[str] = None  # the candidate's engine: "fsdp2", "fsdp2-offload", "zero1".."zero3", ...
    processes: Optional[int] = None  # num_processes of the launch (GPUs per machine)
    machines: Optional[int] = None
    source: str = ""  # where it came from, in the user's words
    notes: Tuple[str, ...] = ()


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
    return LaunchEngine(sharding="fsdp2-offload" if offload else "fsdp2", source="fsdp: " + " ".join(items),
                        notes=notes)


def _fsdp_notes(version: Any, items: List[str], reshard: Any) -> Tuple[str, ...]:
    notes = []
    if str(version) == "1":
        notes.append("FSDP version 1 (flat parameters) modelled as FSDP2's per-parameter shards")
    if "shard_grad_op" in items or "hybrid_shard_zero2" in items or str(reshard).lower() in ("false", "shard_grad_op"):
        notes.append("FSDP without resharding after forward (shard_grad_op) modelled as full shard")
    return tuple(notes)


def _from_accelerate(values: Dict[str, Any], name: str) -> Optional[LaunchEngine]:
    kind = str(values.get("distributed_type", "")).upper()
    if kind == "FSDP":
        fsdp = values.get("fsdp_config") or {}
        offload = _truthy(fsdp.get("fsdp_offload_params", False))
        strategy = str(fsdp.get("fsdp_sharding_strategy", "FULL_SHARD")).lower()
        notes = _fsdp_notes(fsdp.get("fsdp_version", 1), [strategy],
                            fsdp.get("fsdp_reshard_after_forward", True))
        return LaunchEngine(sharding="fsdp2-offload" if offload else "fsdp2", source=name, notes=notes)
    if kind == "DEEPSPEED":
        ds = values.get("deepspeed_config") or {}
        stage = ds.get("zero_stage")
        if stage not in (1, 2, 3):
            return LaunchEngine(source=name, notes=(f"the DeepSpeed plugin of {name} (no zero_stage 1-3 in it) is "
                                                    "not modelled",))
        offloads = [str(ds.get(key, "none")).lower() not in ("none", "") for key in
                    ("offload_optimizer_device", "offload_param_device")]
        sharding = f"zero{stage}"
        if stage == 3 and all(offloads):
            sharding = "zero3-offload"
        elif stage in (1, 2) and offloads[0]:
            sharding = "zero2-offload"
        return LaunchEngine(sharding=sharding, source=name)
    return LaunchEngine(source=name) if kind else None


def launch_engine(training: Dict[str, Any], written: Dict[str, Any], launch: Dict[str, Any]) -> LaunchEngine:
    """The engine, processes and machines the user's launch runs (the training arguments' FSDP first, as the
    Trainer's FSDP plugin is built from them whatever accelerate's file says)."""
    config = launch.get("config_file") or {}
    values: Dict[str, Any] = config["values"] if isinstance(config.get("values"), dict) else {}
    name = f"accelerate_config: {written['accelerate_config']}" if written.get("accelerate_config") \
        else f"accelerate config {config.get('path', '')}"
    engine = _fsdp_from_args(training, written) or (_from_accelerate(values, name) if values else None) \
        or LaunchEngine()
    processes = launch.get("num_processes", values.get("num_processes"))
    machines = launch.get("num_machines", values.get("num_machines"))
    return LaunchEngine(sharding=engine.sharding, source=engine.source, notes=engine.notes,
                        processes=processes if isinstance(processes, int) and processes > 0 else None,
                        machines=machines if isinstance(machines, int) and machines > 0 else None)
