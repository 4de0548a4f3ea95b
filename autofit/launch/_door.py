"""The launch read once, at the door: ``read_launch`` turns the door's ``config``, ``accelerate_config`` and
``launch_args`` into a ``Launch`` (the TRL file as TRL parsed it, the accelerate config given at the door, the engine
they run), which travels on the ``SearchSpec``; ``with_launch`` puts the door's own values over what the launch sets,
as TRL's command line puts its flags over the file (training arguments key by key). No later stage reads a file."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from autofit.core import DEFAULT_ALGO, MAX_EFFECTIVE_BATCH, InputError, Launch, keys_of
from autofit.launch._accelerate_file import check_deepspeed_argument, read_accelerate_config
from autofit.launch._engine import launch_engine
from autofit.launch._file_knobs import option_file_keys
from autofit.launch._run import option_values, passed_through
from autofit.launch._trl_file import read_trl_file
from autofit.launch._trl_values import check_trl_values
from autofit.machine import visible_gpu_count

# The file's key behind each option it sets, for messages that name the user's own key, not a flag they never gave.
_FILE_KEYS = option_file_keys()


def read_launch(values: Mapping[str, Any]) -> Launch:
    """The launch the door names (``config`` with its ``launch_args``, ``accelerate_config``), read: ``InputError``
    (one line naming the file and what is accepted) for what cannot be read. An empty ``Launch`` where it names none."""
    config, accelerate = values.get("config"), values.get("accelerate_config")
    if not config:
        if values.get("launch_args"):
            raise InputError("a launch's flags are read over its config file: give trl <algo> --config FILE")
        if not accelerate:
            return Launch()
        given = read_accelerate_config(str(accelerate))
        return Launch(accelerate=given, engine=launch_engine({}, {}, {}, given))
    world = _world_size(values) if values.get("gpus") is not None else None  # else the launch's own processes
    file = read_trl_file(str(config), str(values.get("algo") or DEFAULT_ALGO), values.get("launch_args") or (),
                         world)
    check_deepspeed_argument(file.training.get("deepspeed"), file.path)
    door = read_accelerate_config(str(accelerate)) if accelerate else None
    return Launch(file=file, accelerate=door, engine=launch_engine(file.training, file.written, file.launch, door))


def with_launch(values: Mapping[str, Any], launch: Launch) -> Dict[str, Any]:
    """The door's option values over those the launch sets."""
    from_launch = option_values(launch)
    if launch.file is None:
        return {**{key: from_launch[key] for key in ("gpus", "nodes") if key in from_launch}, **values}
    _check_file_values(launch, from_launch, values)
    if "effective_batch" in from_launch:  # the file's batch is per device, as in TRL: the effective batch is global
        from_launch["effective_batch"] *= _world_size({**from_launch, **values})
    merged = {**from_launch, **values}
    if values.get("training_args") is not None:
        merged["training_args"] = {**passed_through(launch), **values["training_args"]}
    return merged


def at_door(values: Mapping[str, Any]) -> Tuple[Dict[str, Any], Launch]:
    """The launch read, and the door's values over it: what every door (the CLI's search and estimate, ``fit``)
    does first."""
    launch = read_launch(values)
    return with_launch(values, launch), launch


def _check_file_values(launch: Launch, from_file: Dict[str, Any], given: Mapping[str, Any]) -> None:
    """The values the file gives the search's options, checked as the options would check them but named as the
    file's keys (``per_device_train_batch_size: -4`` was "--effective-batch -8 is not valid")."""
    from autofit.core import FIELDS

    file = launch.file
    assert file is not None
    for key in keys_of("batch"):
        value = file.training.get(key)
        if file.wrote(key) and (isinstance(value, bool) or not isinstance(value, int)
                                or not 1 <= value <= MAX_EFFECTIVE_BATCH):
            raise InputError(f"{file.where(key)} = {value!r}: a whole number from 1 to {MAX_EFFECTIVE_BATCH:,} is "
                             "accepted")
    for name, key in _FILE_KEYS.items():
        value = from_file.get(name)
        if value is None or given.get(name) is not None:
            continue
        kind = FIELDS[name].metadata["kind"]
        if not kind.accepts(value):
            words = (kind.explain(value) if kind.explain else None) or kind.phrase
            raise InputError(f"{file.where(key)} = {value!r} is not valid: {words}")
    check_trl_values(file, given, from_file, _machine_gpus({**from_file, **given}))


def _world_size(values: Mapping[str, Any]) -> int:
    """The GPUs that train together at the door's ``--gpus`` and ``--nodes`` (1 where they are not numbers yet: the
    door refuses those)."""
    gpus, nodes = values.get("gpus", 1), values.get("nodes", 1)
    if gpus == "all":
        gpus = visible_gpu_count() or 1
    return gpus * nodes if isinstance(gpus, int) and isinstance(nodes, int) and gpus > 0 and nodes > 0 else 1


def _machine_gpus(values: Mapping[str, Any]) -> int:
    """The GPUs of one machine that train together, ``--gpus`` (1 where it is not a number yet)."""
    gpus = values.get("gpus", 1)
    if gpus == "all":
        gpus = visible_gpu_count() or 1
    return gpus if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0 else 1
