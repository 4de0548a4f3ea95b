"""The user's TRL config file (``--config FILE``), read as ``trl <algo> --config FILE`` reads it, and what it means
for the search: the options it sets (a flag given at the door overrides the file, as on TRL's command line), the
training arguments passed through to every probe, and the baseline, the user's own run that the ladder starts from.

The launch's own flags after the file (``autofit search -- trl sft --config F --flag v``) are read by TRL's parser over
the file and folded into its text (``autofit.search._launch_flags``); an accelerate config given at the door
(``--accelerate-config``) is the launch's, over the file's ``accelerate_config`` (``autofit.search._accelerate_file``).

The file is read once, by autofit, in the search's process, with limits (``autofit.search._config_file``: a regular
file or a pipe's content, its size, its YAML aliases, no key twice), and that text is what TRL's parser and the export
read: ``--config <(cat sft.yaml)`` works. TRL's parser imports torch, so it runs in a process of its own
(``autofit.probe._trl_config``, forked from the probe server: ``autofit.probe.read_trl_config``), given the text on
its standard input. Its errors are TRL's own messages, one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from autofit.core import (
    ALGORITHMS,
    DEFAULT_ALGO,
    PROBED_KEY,
    SEARCHED_ARGS,
    Baseline,
    FileRun,
    InputError,
    classify_key,
    file_baseline,
    file_options,
    means_the_default,
    one_line,
    option_file_keys,
    read_keys,
    visible_gpu_count,
)
from autofit.probe import read_trl_config
from autofit.search._accelerate_file import read_accelerate_config
from autofit.search._config_file import read_config_text
from autofit.search._launch import LaunchEngine, launch_engine
from autofit.search._launch_flags import fold_flags

READ_TIMEOUT_S = 300
READABLE_ALGOS = tuple(a.name for a in ALGORITHMS.values() if a.trl_command)  # the trainers `trl` has a command for
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


@dataclass(frozen=True)
class UserConfig:
    """One config file as TRL parsed it for ``algo``: the fields of its dataclasses (``training``: the trainer's
    config class, ``model``: ModelConfig, ``script``: the script's arguments) and what the file itself says."""

    path: str
    algo: str
    text: str
    training: Dict[str, Any] = field(default_factory=dict)
    model: Dict[str, Any] = field(default_factory=dict)
    script: Dict[str, Any] = field(default_factory=dict)
    written: Dict[str, Any] = field(default_factory=dict)
    defaults: Dict[str, Any] = field(default_factory=dict)  # the config classes' defaults of the keys written
    launch: Dict[str, Any] = field(default_factory=dict)  # what the launch tells accelerate (``_trl_config``)
    door_file: Dict[str, Any] = field(default_factory=dict)  # --accelerate-config, read: over the file's own

    def engine(self) -> LaunchEngine:
        """The engine, processes and machines of the user's launch (``autofit.search._launch``)."""
        return launch_engine(self.training, self.written, self.launch, self.door_file or None)

    def at_door(self, accelerate_config: Optional[str]) -> UserConfig:
        """This run with the accelerate config given at the door (``--accelerate-config``) over the file's."""
        if not accelerate_config:
            return self
        return dataclasses.replace(self, door_file=read_accelerate_config(accelerate_config))

    def precision(self) -> Optional[str]:
        """The accelerate config's mixed precision where it is the run's: the training arguments turn both bf16 and
        fp16 off (transformers takes its own bf16/fp16 over the launcher's; TRL's bf16 is on by default)."""
        mixed = self.engine().mixed_precision
        if mixed in ("bf16", "fp16") and not self.training.get("bf16") and not self.training.get("fp16"):
            return mixed
        return None

    def wrote(self, key: str) -> bool:
        return key in self.written

    def option_values(self) -> Dict[str, Any]:
        """``SearchOptions`` values the file sets, by option name."""
        values: Dict[str, Any] = {"config": self.path}
        if self.model.get("model_name_or_path"):
            values["model"] = self.model["model_name_or_path"]
        values.update(file_options(self.run))
        engine = self.engine()
        if engine.processes:  # the launch's num_processes, as accelerate launch takes it (--gpus overrides)
            values["gpus"] = engine.processes
        if engine.machines:
            values["nodes"] = engine.machines
        passed = self.passed_through()
        if passed:
            values["training_args"] = passed
        return values

    def passed_through(self) -> Dict[str, Any]:
        """The training arguments the file writes that every probe runs with (the learning rate, weight decay,
        packing, the model's init arguments...): the config class's fields the search neither sets nor must keep
        out of a probe."""
        passed = {key: self.training[key] for key in self.written if key in self.training
                  and key not in SEARCHED_ARGS and key not in MAPPED and key not in NOT_PROBED}
        precision = self.precision()
        if precision:  # the launcher's mixed precision, as transformers takes it where bf16 and fp16 are off
            passed[precision] = True
        return passed

    @property
    def run(self) -> FileRun:
        """The file as the knobs read it (``autofit.core._knobs``)."""
        return FileRun(self.training, self.model, self.written, self.algo)

    def baseline(self, rank_batch: int) -> Baseline:
        """The file's run as the ladder's first level; its micro-batch split only where it is the search's (a
        ``--effective-batch`` or ``--gpus`` given at the door that changes the batch per rank replaces it)."""
        batch, accumulation = self.training.get("per_device_train_batch_size"), \
            self.training.get("gradient_accumulation_steps")
        split = isinstance(batch, int) and isinstance(accumulation, int) and batch * accumulation == rank_batch
        settings = dict(file_baseline(self.run))
        settings["checkpointing"] = settings["checkpointing"] or self.engine().checkpointing  # FSDP's own
        return Baseline(settings=tuple(settings.items()), micro_batch=batch if split else None,
                        grad_accum=accumulation if split else None, sharding=self.engine().sharding, source=self.path)

    def unmodelled(self) -> List[str]:
        """What the file sets that the memory model does not describe (its predictions say so, with a wider band)."""
        from autofit.memory_model import optimizer_known, unmodelled_args

        found = unmodelled_args({key: self.training.get(key) for key in self.written if key in self.training})
        found += [what for key, what in UNMODELLED_MODEL.items() if self.model.get(key) not in (None, False, [], "")]
        if self.wrote("optim") and not optimizer_known(self.training.get("optim")):
            found.append(f"the optimizer {self.training.get('optim')} (two fp32 states assumed)")
        probed = self.probed_as_written()  # the same keys with their values: each named once
        with_value = {key for key in self.written if any(f"({key}: " in said for said in probed)}
        found = [what for what in found if not any(what.endswith(f"({key})") for key in with_value)]
        return found + list(self.engine().notes) + probed

    def probed_as_written(self) -> List[str]:
        """The keys the file changes from TRL's defaults that the memory model does not describe
        (``autofit.core._key_table``): training arguments the probes run as written, ModelConfig's that they do not
        run at all; and the TRL fields the table does not know. In words, each with its value."""
        from autofit.memory_model import UNMODELLED_ARGS

        said = set(UNMODELLED_ARGS) | set(UNMODELLED_MODEL) | {"optim"}
        found = []
        for key, value in self.written.items():
            if key in said or key not in self.defaults or means_the_default(key, value, self.defaults[key]):
                continue
            kind = classify_key(key)
            if kind is None:
                found.append(f"{key}: {value!r} (a setting of this TRL autofit's key table does not know)")
            elif kind[0] == PROBED_KEY and key in self.training:
                found.append(f"{kind[1]} ({key}: {value!r}, probed as written)")
            elif kind[0] == PROBED_KEY:  # ModelConfig's: the probes build the model from the candidate, without it
                found.append(f"{kind[1]} ({key}: {value!r}, not in the probes: neither measured nor modelled)")
        return found


def probe_notes(path: Optional[str], algo: str, device: str) -> List[str]:
    """What the probes on this ``device`` cannot run as the file writes it, one line each, said before any probe:
    an attention kernel this machine has not (the probes load sdpa; best.yaml keeps the user's), an allocator
    setting on the CPU meter (it reaches every probe and changes nothing the meter counts)."""
    from autofit.core import runnable_attention

    if not path:
        return []
    user = read_user_config(path, algo)
    notes = []
    attention = user.model.get("attn_implementation")
    probed, why = runnable_attention(attention, device)
    if why is not None:
        notes.append(f"{path}: attn_implementation {attention} is not probed here ({why}): the probes load "
                     f"{probed or 'sdpa'} instead (it keeps no attention scores either: what is measured and "
                     f"predicted is sdpa's peak); best.yaml keeps {attention}")
    allocator = [key for key, _ in dict(file_baseline(user.run))["env"] if key in ALLOCATOR_ENV]
    if allocator and device == "cpu":
        notes.append(f"{path}: env {', '.join(allocator)} reaches every probe, but the CPU meter counts live tensors, "
                     "not the CUDA allocator's segments: it changes nothing measured here")
    return notes


def with_config(values: Dict[str, Any]) -> Dict[str, Any]:
    """One door's option values with its ``config`` file under them: what the door was given overrides the file, as
    on TRL's command line (training arguments key by key)."""
    if not values.get("config"):
        if values.get("launch_args"):
            raise InputError("a launch's flags are read over its config file: give trl <algo> --config FILE")
        if not values.get("accelerate_config"):
            return values
        engine = launch_engine({}, {}, {}, read_accelerate_config(str(values["accelerate_config"])))
        from_launch = {"gpus": engine.processes, "nodes": engine.machines}
        return {**{key: value for key, value in from_launch.items() if value}, **values}
    user = read_user_config(str(values["config"]), str(values.get("algo") or DEFAULT_ALGO), fresh=True,
                            args=values.get("launch_args")).at_door(values.get("accelerate_config"))
    from_file = user.option_values()
    _check_file_values(user, from_file, values)
    if "effective_batch" in from_file:  # the file's batch is per device, as in TRL: the effective batch is global
        from_file["effective_batch"] *= _world_size({**from_file, **values})
    merged = {**from_file, **values}
    if values.get("training_args") is not None:
        merged["training_args"] = {**user.passed_through(), **values["training_args"]}
    return merged


# The file's key behind each option it sets, for messages that name the user's own key, not a flag they never gave.
_FILE_KEYS = option_file_keys()


def _check_file_values(user: UserConfig, from_file: Dict[str, Any], given: Dict[str, Any]) -> None:
    """The values the file gives the search's options, checked as the options would check them but named as the
    file's keys (``per_device_train_batch_size: -4`` was "--effective-batch -8 is not valid")."""
    from autofit.core import FIELDS

    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        value = user.training.get(key)
        if user.wrote(key) and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise InputError(f"--config {user.path}: {key} = {value!r}: a positive whole number is accepted")
    for name, key in _FILE_KEYS.items():
        value = from_file.get(name)
        if value is None or given.get(name) is not None:
            continue
        kind = FIELDS[name].metadata["kind"]
        if not kind.accepts(value):
            words = (kind.explain(value) if kind.explain else None) or kind.phrase
            raise InputError(f"--config {user.path}: {key} = {value!r} is not valid: {words}")


def _world_size(values: Dict[str, Any]) -> int:
    """The GPUs that train together at the door's ``--gpus`` and ``--nodes`` (1 where they are not numbers yet: the
    door refuses those)."""
    gpus, nodes = values.get("gpus", 1), values.get("nodes", 1)
    if gpus == "all":
        gpus = visible_gpu_count() or 1
    return gpus * nodes if isinstance(gpus, int) and isinstance(nodes, int) and gpus > 0 and nodes > 0 else 1


_READ: Dict[Tuple[str, str, str, Tuple[str, ...]], UserConfig] = {}
_ARGS: Dict[str, Tuple[str, ...]] = {}  # each path's launch flags as the door read them
_TEXTS: Dict[str, str] = {}  # each path's text as the door read it: later stages (the export) never read it again


def read_user_config(path: str, algo: str, fresh: bool = False, args: Optional[Sequence[str]] = None) -> UserConfig:
    """The file as ``trl <algo> --config`` reads it; ``InputError`` with TRL's message (one line) when it refuses.
    The door reads the file (``fresh``); every later stage gets the text the door read (a pipe is read once) and the
    launch's flags the door read over it (``args``: ``trl <algo> --config FILE ARGS``)."""
    if algo not in READABLE_ALGOS:
        raise InputError(f"--config reads a file of the trl command's trainers ({', '.join(READABLE_ALGOS)}), "
                         f"not of '{algo}'")
    if fresh or path not in _TEXTS:
        _TEXTS[path] = read_config_text(path)
        _ARGS[path] = tuple(args or ())
    text, flags = _TEXTS[path], tuple(args) if args is not None else _ARGS.get(path, ())
    key = (path, algo, hashlib.sha1(text.encode()).hexdigest(), flags)
    if key not in _READ:
        _READ[key] = _parse(path, algo, text, flags)
    return _READ[key]


def _parse(path: str, algo: str, text: str, flags: Tuple[str, ...] = ()) -> UserConfig:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRANSFORMERS_VERBOSITY": "error"}
    try:
        done = read_trl_config(algo, path, flags, text, env, READ_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InputError(f"--config {path}: TRL's parser did not run ({type(exc).__name__}: {one_line(exc)})") \
            from None
    data: Dict[str, Any] = {}
    if done.stdout.strip():
        try:
            data = json.loads(done.stdout.strip().splitlines()[-1])
        except ValueError:
            data = {}
    if done.returncode != 0 or "error" in data or "fields" not in data:
        raise InputError(f"--config {path}: " + _refusal(done, data, algo))
    fields = data["fields"]
    text, flagged = fold_flags(text, path, flags, fields)  # the launch's flags, written into its file
    return UserConfig(path=path, algo=algo, text=text, training=fields.get("training", {}),
                      model=fields.get("model", {}), script=fields.get("script", {}),
                      written={**data.get("written", {}), **flagged}, defaults=data.get("defaults", {}),
                      launch=data.get("launch") or {})


def _refusal(done: subprocess.CompletedProcess[str], data: Dict[str, Any], algo: str) -> str:
    """TRL's own words, one line: its error (a ValueError, a YAML error) or argparse's for a value it refused."""
    if data.get("error"):
        message = one_line("; ".join(part.strip() for part in str(data["error"]).splitlines() if part.strip()))
        if "Unknown arguments" in message:
            message += f" (keys TRL's {algo} command does not take; is the file for another trainer? --algo)"
        return message
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    if errors:
        return "TRL refused a value: " + one_line(errors[-1].split("error:", 1)[1].strip())
    return f"TRL's parser failed (exit {done.returncode}): " + one_line((done.stderr.strip().splitlines() or ["?"])[-1])
