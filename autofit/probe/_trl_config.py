"""Read a TRL config file exactly as ``trl <algo> --config FILE`` reads it, in a process of its own (TRL imports
torch, which the search's process never does): ``python -m autofit.probe._trl_config ALGO FILE`` reads the file's
text on its standard input (the search read the file once, with limits: a pipe cannot be read twice) and prints one
JSON object, the parsed fields of every dataclass of the algorithm's script, or ``{"error": ...}`` with TRL's own
message and exit code 2. TRL's parser reads the text from a private copy; its messages name ``FILE``.

The script's own parser is used (``trl.scripts.<algo>.make_parser()``: ScriptArguments or its GRPO/RLOO variant,
the trainer's config class, ModelConfig, DatasetMixtureConfig), fresh for the file (TRL's parser keeps a file's
values as its defaults), with the file's ``env:`` block undone afterwards. Keys no dataclass knows are TRL's error
unless ``accelerate launch`` takes them (``num_processes``), as in TRL's command line, and
``accelerate_config`` (TRL's names: fsdp2, zero3, ..., or a path) is resolved as TRL's command line resolves it; what
the launch says (its options and the accelerate config file, read) is reported as ``launch``. The GPU is hidden and
``--use_cpu`` given so that TRL's bf16 check passes on any machine; the file's own ``use_cpu`` is what is reported.
Words after ``FILE`` are the launch's own flags, read over the file as ``trl <algo> --config FILE ...`` reads them;
words after a ``--`` among them are ``accelerate launch``'s own options, for accelerate's parser only.
Where DeepSpeed is not installed (a planning laptop), a ``deepspeed`` training argument is read as written without
building transformers' DeepSpeed config (which needs the package): the estimate models it; the search says it needs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence

import yaml

from autofit.core import ALGORITHMS

WORLD_SIZE_ENV = "AUTOFIT_LAUNCH_WORLD_SIZE"  # the search's --gpus x --nodes, where given: the world TRL's config sees
SCRIPTS = {a.name: a.trl_command for a in ALGORITHMS.values() if a.trl_command}  # the `trl` commands


def _plain(value: Any) -> Any:
    """A JSON value: dataclasses, enums and torch dtypes by their name."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return getattr(value, "value", None) if hasattr(value, "value") and isinstance(value.value, str) \
        else str(value)


def _accelerate_leftovers(unknown: List[str]) -> List[str]:
    """The unknown arguments that ``accelerate launch`` does not take either (TRL's command line passes it the rest)."""
    if not unknown:
        return []
    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError:
        return unknown
    _, rest = launch_command_parser().parse_known_args(unknown + ["script.py"])
    return [item for item in rest if item.startswith("--")]


def _resolved_launch(unknown: List[str]) -> List[str]:
    """The launch arguments as TRL's command line hands them to ``accelerate launch``: ``--accelerate_config NAME``
    (one of TRL's own, ``trl/accelerate_configs/NAME.yaml``, or a path) becomes ``--config_file PATH``."""
    if "--accelerate_config" not in unknown:
        return unknown
    try:
        from trl.cli.accelerate_config import resolve_accelerate_config_argument
    except ImportError:  # an older TRL: its command line has no accelerate_config
        return unknown
    return list(resolve_accelerate_config_argument(list(unknown)))


def _launch_settings(launch: List[str]) -> Dict[str, Any]:
    """What the launch arguments tell ``accelerate launch``: its options as given (``num_processes``,
    ``mixed_precision``, ...) and the path of the accelerate config file they name (``config_file``)."""
    if not launch:
        return {}
    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError:
        return {}
    known, _ = launch_command_parser().parse_known_args(launch + ["script.py"])
    words = {word.split("=", 1)[0] for word in launch}  # --num_processes 2 and --num_processes=2
    given = {key: value for key, value in vars(known).items()
             if f"--{key}" in words or f"--{key.replace('_', '-')}" in words}
    settings: Dict[str, Any] = {k: _plain(v) for k, v in given.items() if k != "config_file"}
    if known.config_file:  # read by the search's process, with the limits of the TRL file
        settings["config_file"] = {"path": str(known.config_file)}
    return settings


def read(algo: str, path: str, extra: Sequence[str] = ()) -> Dict[str, Any]:
    """The file as TRL parses it for ``algo``, with the launch's flags ``extra`` over it (after a ``--``: accelerate
    launch's options, which TRL's parser never sees); ``path`` is a private copy
    (rewritten without the ``deepspeed`` key where DeepSpeed is not installed)."""
    with open(path) as handle:
        written = yaml.safe_load(handle)  # what TRL's parser loads (PyYAML, YAML 1.1)
    if not isinstance(written, dict):
        raise ValueError(f"Config file {path} must contain a YAML mapping.")
    extra = list(extra)
    at = extra.index("--") if "--" in extra else len(extra)
    trl_args, accelerate_args = extra[:at], extra[at + 1:]
    unbuilt = written.get("deepspeed") if importlib.util.find_spec("deepspeed") is None else None
    if unbuilt:  # TrainingArguments would import deepspeed to build its config: read the rest, keep it as written
        with open(path, "w") as handle:
            yaml.safe_dump({key: value for key, value in written.items() if key != "deepspeed"}, handle)
    module = importlib.import_module(f"trl.scripts.{SCRIPTS[algo]}")
    parser = module.make_parser()
    saved, world = dict(os.environ), _launch_world_size(module, written, trl_args, accelerate_args)
    try:
        with _at_world_size(world):
            *parsed, unknown = parser.parse_args_and_config(args=["--config", path, "--use_cpu", *trl_args],
                                                            return_remaining_strings=True)
    except ValueError as exc:
        if world == 1:
            raise
        raise ValueError(f"{exc} (as TRL reads the file in each of the launch's {world} processes)") from None
    finally:
        os.environ.clear()
        os.environ.update(saved)
    launch = _resolved_launch(list(unknown) + accelerate_args)
    leftovers = _accelerate_leftovers(launch)
    if leftovers:
        raise ValueError(f"Unknown arguments from config file: {leftovers}. Please remove them, add them to the "
                         "dataclass, or set `fail_with_unknown_args=False`.")
    classes = [type(instance).__name__ for instance in parsed]
    fields = {name: {f.name: _plain(getattr(instance, f.name)) for f in dataclasses.fields(instance)}
              for name, instance in zip(("script", "training", "model", "datasets"), parsed, strict=False)}
    fields["training"]["use_cpu"] = bool(written.get("use_cpu", False))  # ours was only for the parse
    if unbuilt:
        fields["training"]["deepspeed"] = _plain(unbuilt)
    flagged = {word[2:].split("=", 1)[0].replace("-", "_") for word in trl_args if word.startswith("--")}
    defaults = {item.name: _plain(_default(item)) for instance in parsed for item in dataclasses.fields(instance)
                if item.name in written or item.name in flagged}
    choices = {item.name: [str(choice) for choice in item.metadata["choices"]] for instance in parsed
               for item in dataclasses.fields(instance)
               if (item.name in written or item.name in flagged) and item.metadata.get("choices")}
    return {"classes": classes, "fields": fields, "written": _plain(written), "accelerate": list(unknown),
            "launch": _launch_settings(launch), "defaults": defaults, "choices": choices}


def _launch_world_size(module: Any, written: Dict[str, Any], trl_args: Sequence[str],
                       accelerate_args: Sequence[str]) -> int:
    """The processes the launch trains with, as TRL's config sees them in ``accelerate launch``'s ranks
    (``TrainingArguments.world_size``): the search's ``--gpus`` x ``--nodes`` (``WORLD_SIZE_ENV``), else the launch's
    ``num_processes`` (the file's key, a flag, accelerate's options or its config file), else 1. Read before the
    config is built, from the words TRL's parser would hand to ``accelerate launch``, without building a dataclass."""
    door = os.environ.get(WORLD_SIZE_ENV, "")
    if door.isdigit() and int(door) > 0:
        return int(door)
    scan = module.make_parser()  # fresh: set_defaults_with_config changes the parser it is called on
    try:
        from_file = scan.set_defaults_with_config(**{k: v for k, v in written.items() if k != "env"})
        _, from_flags = scan.parse_known_args(list(trl_args))
    except (SystemExit, ValueError, TypeError):  # the real parse says what is wrong
        return 1
    settings = _launch_settings(_resolved_launch(list(from_file) + list(from_flags) + list(accelerate_args)))
    processes = settings.get("num_processes")
    if processes is None and isinstance(settings.get("config_file"), dict):
        try:
            with open(settings["config_file"]["path"]) as handle:
                processes = (yaml.safe_load(handle) or {}).get("num_processes")
        except (OSError, yaml.YAMLError, AttributeError):
            processes = None
    return processes if isinstance(processes, int) and not isinstance(processes, bool) and processes > 0 else 1


@contextlib.contextmanager
def _at_world_size(world: int) -> Iterator[None]:
    """TRL's GRPO and RLOO configs check their generation batch against ``world_size`` in ``__post_init__``: here it
    is the launch's, not this one process's 1 (a four-process file, ``per_device_train_batch_size: 1`` and
    ``num_generations: 2``, was refused: "generation_batch_size (1) must be divisible by num_generations (2)")."""
    if world == 1:
        yield
        return
    from transformers import TrainingArguments

    declared = TrainingArguments.__dict__["world_size"]
    TrainingArguments.world_size = property(lambda self: world)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        TrainingArguments.world_size = declared  # type: ignore[method-assign]


def _default(item: dataclasses.Field[Any]) -> Any:
    """A field's default as its class declares it (None where it has none)."""
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None


def main(argv: List[str]) -> int:
    algo, path, *extra = argv
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import warnings

    warnings.simplefilter("ignore")
    text = sys.stdin.read()
    with tempfile.TemporaryDirectory(prefix="autofit-config-") as folder:
        copy = Path(folder) / "config.yaml"
        copy.write_text(text, encoding="utf-8")
        try:
            print(json.dumps(read(algo, str(copy), extra)))
            return 0
        except SystemExit as exc:  # argparse refused a value: its message went to stderr, one line starting "error:"
            return int(exc.code or 2)
        except (ValueError, TypeError, KeyError, OSError, yaml.YAMLError) as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}".replace(str(copy), path)}))
            return 2


def forked_main(argv: List[str], text: str, out: str, err: str, cwd: str, env: Dict[str, str]) -> None:
    """``main`` in a process forked from the probe server (``autofit.probe._trl_read``), as ``python -m
    autofit.probe._trl_config ARGV`` runs it: the caller's environment and working directory, ``text`` on its
    standard input, its standard output and error written to the files ``out`` and ``err``, its exit code the
    process's."""
    import io

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, name in ((1, out), (2, err)):
        os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = os.fdopen(2, "w", encoding="utf-8", closefd=False)
    sys.stdin = io.StringIO(text)
    sys.argv = [__file__, *argv]  # as `python -m` sets it: argparse names the program after it
    if "transformers" in sys.modules and env.get("TRANSFORMERS_VERBOSITY") == "error":  # read at the server's import
        from transformers.utils import logging as transformers_logging

        transformers_logging.set_verbosity_error()
    try:
        code = main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
