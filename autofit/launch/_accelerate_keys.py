"""Every key of an accelerate config file (``accelerate launch --config_file``, ``--accelerate-config``, a TRL file's
``accelerate_config:``), classified as ``autofit.memory_model._key_table`` classifies a TRL file's: the top-level
settings (accelerate's ``ClusterConfig``), the FSDP plugin's ``fsdp_config`` and the DeepSpeed plugin's
``deepspeed_config`` (the keys ``accelerate config`` writes and ``accelerate launch`` takes as options).

A key set away from its default whose kind is ``not-probed`` or ``probed`` is named in a note with the wide band; a
key the table does not know is named too (``tests/memory_model/test_key_table.py`` fails when the installed accelerate
writes or takes one). The probes run autofit's own engine for the launch's; what the engine's keys mean for the ledger
is ``autofit.launch._engine``'s.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

from autofit.core import MODELLED, clip
from autofit.memory_model import NO_MEMORY, NOT_PROBED

_LAUNCH = "where and how the processes start"
_TPU = "a TPU setting: a GPU launch ignores it"
_LOAD = "how the weights load (before training: no training peak)"

TOP = {
    "distributed_type": (MODELLED, "the engine: FSDP, DeepSpeed, data parallel (MEGATRON_LM and XLA named)"),
    "mixed_precision": (MODELLED, "the run's precision where the training arguments turn bf16 and fp16 off"),
    "num_processes": (MODELLED, "the GPUs that train together (--gpus)"),
    "num_machines": (MODELLED, "the machines (--nodes)"),
    "fsdp_config": (MODELLED, "the FSDP plugin: its keys below"),
    "deepspeed_config": (MODELLED, "the DeepSpeed plugin: its keys below"),
    "use_cpu": (NOT_PROBED, "a launch on the CPU: no GPU memory to fit (the search's --device says where probes run)"),
    "fp8_config": (NOT_PROBED, "fp8 training: the ledger has no fp8 terms and the probes run bf16"),
    "parallelism_config": (NOT_PROBED, "tensor, context or sequence parallelism: not modelled (data parallel and "
                                       "the sharding engines are)"),
    "megatron_lm_config": (NOT_PROBED, "Megatron-LM: not modelled"),
    "dynamo_config": (NOT_PROBED, "torch.compile by accelerate: the probes run eager"),
    "downcast_bf16": (NO_MEMORY, _TPU),
    "compute_environment": (NO_MEMORY, _LAUNCH), "debug": (NO_MEMORY, _LAUNCH), "machine_rank": (NO_MEMORY, _LAUNCH),
    "gpu_ids": (NO_MEMORY, _LAUNCH), "main_process_ip": (NO_MEMORY, _LAUNCH),
    "main_process_port": (NO_MEMORY, _LAUNCH), "rdzv_backend": (NO_MEMORY, _LAUNCH),
    "same_network": (NO_MEMORY, _LAUNCH), "main_training_function": (NO_MEMORY, _LAUNCH),
    "enable_cpu_affinity": (NO_MEMORY, _LAUNCH), "mpirun_config": (NO_MEMORY, _LAUNCH),
    "tpu_name": (NO_MEMORY, _TPU), "tpu_zone": (NO_MEMORY, _TPU), "tpu_use_cluster": (NO_MEMORY, _TPU),
    "tpu_use_sudo": (NO_MEMORY, _TPU), "command_file": (NO_MEMORY, _TPU), "commands": (NO_MEMORY, _TPU),
    "tpu_vm": (NO_MEMORY, _TPU), "tpu_env": (NO_MEMORY, _TPU),
}
FSDP = {
    "fsdp_version": (MODELLED, "FSDP2's per-parameter shards (version 1's flat parameters: the same bytes, said)"),
    "fsdp_sharding_strategy": (MODELLED, "full shard; shard_grad_op and hybrid modelled as full shard (said), "
                                         "no_shard as data parallel"),
    "fsdp_offload_params": (MODELLED, "parameters, gradients and optimizer states on the host (fsdp2-offload)"),
    "fsdp_reshard_after_forward": (MODELLED, "resharding after forward (off: modelled as on, said)"),
    "fsdp_activation_checkpointing": (MODELLED, "the checkpointing the baseline starts with"),
    "fsdp_auto_wrap_policy": (MODELLED, "one unit per decoder layer (NO_WRAP said)"),
    "fsdp_transformer_layer_cls_to_wrap": (MODELLED, "the decoder layer, the ledger's unit"),
    "fsdp_min_num_params": (NOT_PROBED, "size-based wrapping: modelled as one unit per decoder layer"),
    "fsdp_activation_checkpointing_offload": (NOT_PROBED, "checkpointed activations moved to the host: not modelled"),
    "fsdp_backward_prefetch": (NO_MEMORY, "FSDP version 1's prefetch order (FSDP2 prefetches one unit; the "
                                          "ledger holds it)"),
    "fsdp_backward_prefetch_policy": (NO_MEMORY, "accelerate before 1.0's name of fsdp_backward_prefetch, which "
                                                 "configs still carry beside it (the prefetch order)"),
    "fsdp_forward_prefetch": (NO_MEMORY, "FSDP version 1's prefetch order (FSDP2 prefetches one unit; the "
                                         "ledger holds it)"),
    "fsdp_state_dict_type": (NO_MEMORY, "how checkpoints are saved (a probe writes none)"),
    "fsdp_sync_module_states": (NO_MEMORY, _LOAD), "fsdp_cpu_ram_efficient_loading": (NO_MEMORY, _LOAD),
    "fsdp_use_orig_params": (NO_MEMORY, "version 1's parameter views (the same bytes)"),
}
DEEPSPEED = {
    "zero_stage": (MODELLED, "the ZeRO stage (zero1, zero2, zero3)"),
    "offload_optimizer_device": (MODELLED, "the optimizer offloaded (zero2-offload; host memory said)"),
    "offload_param_device": (MODELLED, "the parameters offloaded (zero3-offload with the optimizer's)"),
    "deepspeed_config_file": (MODELLED, "the JSON's stage, buckets and offload devices, read"),
    "gradient_accumulation_steps": (NO_MEMORY, "the Trainer's gradient_accumulation_steps is the run's (it fills "
                                               "the plugin's)"),
    "gradient_clipping": (NO_MEMORY, "the Trainer's max_grad_norm is the run's"),
    "offload_optimizer_nvme_path": (NO_MEMORY, "where an offload goes (the offload itself is modelled)"),
    "offload_param_nvme_path": (NO_MEMORY, "where an offload goes (the offload itself is modelled)"),
    "zero3_init_flag": (NO_MEMORY, _LOAD), "zero3_save_16bit_model": (NO_MEMORY, "how checkpoints are saved"),
    "deepspeed_hostfile": (NO_MEMORY, _LAUNCH), "deepspeed_inclusion_filter": (NO_MEMORY, _LAUNCH),
    "deepspeed_exclusion_filter": (NO_MEMORY, _LAUNCH), "deepspeed_multinode_launcher": (NO_MEMORY, _LAUNCH),
    "deepspeed_moe_layer_cls_names": (NO_MEMORY, "ZeRO-3's leaf modules of a mixture of experts (gathered as the "
                                                 "ledger's layer)"),
}
SECTIONS = {"": TOP, "fsdp_config": FSDP, "deepspeed_config": DEEPSPEED}
# Values that leave a not-probed key's feature off (accelerate's own defaults and what `accelerate config` writes)
_OFF: Tuple[Any, ...] = (None, False, "", "no", "NO", "none", "None", [], {}, 0)


def classify_accelerate(key: str, section: str = "") -> Optional[Tuple[str, str]]:
    """(kind, why) of a key of an accelerate config file, top level (``section`` "") or in ``fsdp_config`` /
    ``deepspeed_config``; None for a key the table does not know."""
    return SECTIONS[section].get(key)


def unclassified_accelerate(keys: Iterable[str], section: str = "") -> List[str]:
    return sorted(key for key in set(keys) if key not in SECTIONS[section])


def _is_off(key: str, value: Any) -> bool:
    if key == "parallelism_config" and isinstance(value, dict):  # every size 1: no parallelism beyond data
        return all(v in (None, 1, "1") for k, v in value.items() if k.endswith("_size"))
    if key == "dynamo_config" and isinstance(value, dict):
        return str(value.get("dynamo_backend", "NO")).upper() == "NO"
    return value in _OFF


UNKNOWN_NAMED = 8  # unknown keys named one by one; past that, one note counts them


def accelerate_notes(values: Dict[str, Any], name: str) -> List[str]:
    """The keys of an accelerate config (as read, the launch's options over it) that the ledger does not describe,
    each in a note: a not-probed feature turned on, and a key the table does not know."""
    notes: List[str] = []
    unknown: List[str] = []
    kind = str(values.get("distributed_type", "")).upper()
    for section, table in SECTIONS.items():
        block = values.get(section, {}) if section else values
        if not isinstance(block, dict) or (section == "fsdp_config" and kind != "FSDP") \
                or (section == "deepspeed_config" and kind != "DEEPSPEED"):
            continue  # a plugin's block the distributed type does not use
        for key, value in block.items():
            if key == "deepspeed_config_file_values":  # the JSON, read by autofit
                continue
            where = clip(f"{section}.{key}" if section else str(key), 80)
            entry = table.get(key)
            if entry is None:
                unknown.append(f"{where}: {clip(repr(value), 80)}")
            elif entry[0] == NOT_PROBED and not _is_off(key, value):
                notes.append(f"{entry[1]} ({where}: {clip(repr(value), 80)} in {name})")
    if len(unknown) > UNKNOWN_NAMED:  # one note, of a bounded length, for a file of thousands of keys
        return notes + [f"{len(unknown)} keys of accelerate's config autofit's key table does not know in {name}: "
                        f"{'; '.join(unknown[:UNKNOWN_NAMED])}; and {len(unknown) - UNKNOWN_NAMED} more"]
    return notes + [f"{item} in {name} (a key of accelerate's config autofit's key table does not know)"
                    for item in unknown]


def markdown_sections() -> List[str]:
    """docs/keys.md's section for accelerate's config file."""
    lines = ["", "## Every key of your accelerate config file", "",
             "The file `accelerate launch --config_file` reads (`--accelerate-config FILE`, a TRL file's "
             "`accelerate_config:`, or `autofit search -- accelerate launch --config_file FILE ...`): its top level, "
             "and the FSDP and DeepSpeed plugins' keys. A `not-probed` key turned on, or a key this table does not "
             "know, is named in a note and gets the wide band.", "",
             "| key | kind | what |", "|---|---|---|"]
    for section, table in SECTIONS.items():
        for key in sorted(table):
            kind, why = table[key]
            lines.append(f"| `{section + '.' if section else ''}{key}` | {kind} | {why} |")
    return lines
