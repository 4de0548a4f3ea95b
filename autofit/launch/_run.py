"""What the user's launch (``Launch``, read once at the door) means for the search: the options it sets (a flag given
at the door overrides them, as on TRL's command line), the training arguments passed through to every probe, the
baseline (the user's own run, where the ladder starts), and the notes: what the memory model does not describe and
what the probes here cannot run as written."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from autofit.core import SEARCHED_ARGS, Baseline, Launch, TrlFile, keys_of, runnable_attention
from autofit.launch._file_knobs import file_baseline, file_options, read_keys
from autofit.memory_model import PROBED_KEY, classify_key, means_the_default

# Training arguments of the user's file that a probe must not run with: it writes no checkpoint, pushes and reports
# nowhere, evaluates nothing (it has no evaluation data) and starts from scratch; the export keeps them all.
NOT_PROBED = frozenset({
    "output_dir", "overwrite_output_dir", "push_to_hub", "hub_model_id", "hub_strategy", "hub_token",
    "hub_private_repo", "hub_always_push", "hub_revision", "report_to", "logging_dir", "run_name", "project",
    "trackio_space_id", "eval_strategy", "eval_steps", "do_eval", "eval_on_start", "load_best_model_at_end",
    "metric_for_best_model", "resume_from_checkpoint", "save_strategy", "save_steps", "save_total_limit",
    "logging_steps", "logging_strategy", "num_train_epochs", "max_steps",
})
# What the search itself sets from the file (the knobs' options and baseline): not passed through again.
MAPPED = frozenset(read_keys())
# The environment variables of PyTorch's allocators: the CPU meter counts live tensors, never the allocator's
# segments, so on the CPU they change nothing a probe measures.
ALLOCATOR_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
# ModelConfig's settings the probes and the memory model leave out (the training arguments' are the memory model's
# ``unmodelled_args``): said in a note.
UNMODELLED_MODEL = {"use_dora": "DoRA adapters (probed as plain LoRA)",
                    "lora_target_parameters": "LoRA on parameters (lora_target_parameters, probed without)"}


def option_values(launch: Launch) -> Dict[str, Any]:
    """``SearchOptions`` values the launch sets, by option name."""
    engine, file = launch.engine, launch.file
    values: Dict[str, Any] = {}
    if file is not None:
        values["config"] = file.path
        if file.model.get("model_name_or_path"):
            values["model"] = file.model["model_name_or_path"]
        values.update(file_options(file.run))
    if engine.processes:  # the launch's num_processes, as accelerate launch takes it (--gpus overrides)
        values["gpus"] = engine.processes
    if engine.machines:
        values["nodes"] = engine.machines
    passed = passed_through(launch)
    if passed:
        values["training_args"] = passed
    return values


def precision(launch: Launch) -> Optional[str]:
    """The accelerate config's mixed precision where it is the run's: the training arguments turn both bf16 and fp16
    off (transformers takes its own bf16/fp16 over the launcher's; TRL's bf16 is on by default)."""
    mixed, training = launch.engine.mixed_precision, launch.file.training if launch.file else {}
    if launch.file is not None and mixed in ("bf16", "fp16") and not training.get("bf16") \
            and not training.get("fp16"):
        return mixed
    return None


def passed_through(launch: Launch) -> Dict[str, Any]:
    """The training arguments the file writes that every probe runs with (the learning rate, weight decay, packing,
    the model's init arguments...): the config class's fields the search neither sets nor must keep out of a probe."""
    file = launch.file
    if file is None:
        return {}
    passed = {key: file.training[key] for key in file.written if key in file.training
              and key not in SEARCHED_ARGS and key not in MAPPED and key not in NOT_PROBED}
    mixed = precision(launch)
    if mixed:  # the launcher's mixed precision, as transformers takes it where bf16 and fp16 are off
        passed[mixed] = True
    return passed


def baseline(launch: Launch, rank_batch: int) -> Optional[Baseline]:
    """The launch's run as the ladder's first level (None where the door named no file); the file's micro-batch split
    only where it is the search's (a ``--effective-batch`` or ``--gpus`` given at the door that changes the batch per
    rank replaces it)."""
    engine, file = launch.engine, launch.file
    if file is None:
        if launch.accelerate is None:
            return None
        return Baseline(settings=(("checkpointing", engine.checkpointing),), sharding=engine.sharding,
                        source=launch.source)
    batch, accumulation = (file.training.get(key) for key in keys_of("batch"))
    split = isinstance(batch, int) and isinstance(accumulation, int) and batch * accumulation == rank_batch
    settings = dict(file_baseline(file.run))
    settings["checkpointing"] = settings["checkpointing"] or engine.checkpointing  # FSDP's own
    return Baseline(settings=tuple(settings.items()), micro_batch=batch if split else None,
                    grad_accum=accumulation if split else None, sharding=engine.sharding, source=file.path)


def unmodelled(launch: Launch) -> List[str]:
    """What the launch sets that the memory model does not describe (its predictions say so, with a wider band)."""
    from autofit.memory_model import optimizer_known, unmodelled_args

    file = launch.file
    if file is None:
        return list(launch.engine.notes)
    found = unmodelled_args({key: file.training.get(key) for key in file.written if key in file.training})
    found += [what for key, what in UNMODELLED_MODEL.items() if file.model.get(key) not in (None, False, [], "")]
    if file.wrote("optim") and not optimizer_known(file.training.get("optim")):
        found.append(f"the optimizer {file.training.get('optim')} (two fp32 states assumed)")
    probed = probed_as_written(file)  # the same keys with their values: each named once
    with_value = {key for key in file.written if any(f"({key}: " in said for said in probed)}
    found = [what for what in found if not any(what.endswith(f"({key})") for key in with_value)]
    return found + list(launch.engine.notes) + probed


def unmodelled_note(launch: Launch) -> Optional[str]:
    """The note of what the launch sets that the memory model does not describe; None where it sets nothing such."""
    found = unmodelled(launch)
    if not found:
        return None
    return (f"{launch.source} sets what the memory model does not describe ({'; '.join(found)}): its predictions "
            "there are a guess (the wide band), and the probes measure what they run")


def probed_as_written(file: TrlFile) -> List[str]:
    """The keys the file changes from TRL's defaults that the memory model does not describe
    (``autofit.memory_model._key_table``): training arguments the probes run as written, ModelConfig's that they do
    not run at all; and the TRL fields the table does not know. In words, each with its value."""
    from autofit.memory_model import UNMODELLED_ARGS

    said = set(UNMODELLED_ARGS) | set(UNMODELLED_MODEL) | {"optim"}
    found = []
    for key, value in file.written.items():
        if key in said or key not in file.defaults or means_the_default(key, value, file.defaults[key]):
            continue
        kind = classify_key(key)
        if kind is None:
            found.append(f"{key}: {value!r} (a setting of this TRL autofit's key table does not know)")
        elif kind[0] == PROBED_KEY and key in file.training:
            found.append(f"{kind[1]} ({key}: {value!r}, probed as written)")
        elif kind[0] == PROBED_KEY:  # ModelConfig's: the probes build the model from the candidate, without it
            found.append(f"{kind[1]} ({key}: {value!r}, not in the probes: neither measured nor modelled)")
    return found


def probe_notes(launch: Launch, device: str) -> List[str]:
    """What the probes on this ``device`` cannot run as the file writes it, one line each, said before any probe:
    an attention kernel this machine has not (the probes load sdpa; best.yaml keeps the user's), an allocator
    setting on the CPU meter (it reaches every probe and changes nothing the meter counts)."""
    file = launch.file
    if file is None:
        return []
    notes = []
    attention = file.model.get("attn_implementation")
    probed, why = runnable_attention(attention, device)
    if why is not None:
        notes.append(f"{file.path}: attn_implementation {attention} is not probed here ({why}): the probes load "
                     f"{probed or 'sdpa'} instead (it keeps no attention scores either: what is measured and "
                     f"predicted is sdpa's peak); best.yaml keeps {attention}")
    allocator = [key for key, _ in dict(file_baseline(file.run))["env"] if key in ALLOCATOR_ENV]
    if allocator and device == "cpu":
        notes.append(f"{file.path}: env {', '.join(allocator)} reaches every probe, but the CPU meter counts live "
                     "tensors, not the CUDA allocator's segments: it changes nothing measured here")
    return notes
