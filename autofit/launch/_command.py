"""``autofit search|estimate [autofit's options] -- <your launch>``: the command a user already runs, read into the
options ``--config``, ``--accelerate-config`` and ``--algo`` give, plus the launch's own flags (``launch_args``),
which TRL's parser reads over the file as ``trl`` does (``autofit.launch._trl_file``). Two launches are read:

- ``trl <command> --config FILE [--accelerate_config NAME|PATH] [--field value ...] [accelerate's options]``;
- ``accelerate launch [accelerate's options] [-m] trl <command> ...``, accelerate's ``--config_file`` as
  ``--accelerate-config`` and its other options as the launch's, after a ``--`` in ``launch_args``: accelerate's own
  parser reads them, never TRL's (``--debug`` is both's), in the TRL parser's process (it imports torch, which this
  process never does).

The command names are TRL's own (``trl.cli.commands``); ``--`` is split off before argparse sees the line. autofit's
options given before ``--`` override the launch's, as flags after ``--config`` override the file in TRL. Anything else
(``python train.py``, ``torchrun ...``, ``trl vllm-serve``, a launch without ``--config``) is one line naming the part
that cannot be read and what is accepted (exit 2).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from autofit.core import ALGORITHMS, InputError
from autofit.launch._accelerate_file import resolve

# autofit's algorithms by the trl command that trains them
COMMANDS = {a.trl_command: a.name for a in ALGORITHMS.values() if a.trl_command}
ACCEPTED = ("trl <command> --config FILE ..., or accelerate launch [options] [-m] trl <command> --config FILE ... "
            f"(<command>: {', '.join(COMMANDS)})")


def split_launch(argv: Sequence[str]) -> Tuple[List[str], Optional[List[str]]]:
    """(autofit's own words, the launch's words after the first ``--``, or None where there is none)."""
    words = list(argv)
    if "--" not in words:
        return words, None
    at = words.index("--")
    return words[:at], words[at + 1:]


def _value(words: List[str], at: int, name: str) -> str:
    if "=" in words[at]:
        return words[at].split("=", 1)[1]
    if at + 1 >= len(words) or words[at + 1].startswith("--"):
        raise InputError(f"the launch's {name} has no value: give {name} FILE")
    return words[at + 1]


def _take(words: List[str], names: Sequence[str]) -> Tuple[Optional[str], List[str]]:
    """(the last value of the option ``names``, the words without it)."""
    found, rest, at = None, [], 0
    while at < len(words):
        word = words[at]
        if word.split("=", 1)[0] in names:
            found = _value(words, at, names[0])
            at += 1 if "=" in word else 2
            continue
        rest.append(word)
        at += 1
    return found, rest


def trl_command_names() -> Tuple[str, ...]:
    """The commands of the installed ``trl`` (its own list; autofit's where this TRL has none to give)."""
    try:
        from trl.cli.commands import get_commands
    except ImportError:
        return tuple(COMMANDS)
    return tuple(command.name for command in get_commands())


def _trl(words: List[str], launcher: str) -> Dict[str, Any]:
    if not words:
        raise InputError(f"'{launcher}' names no trl command: accepted are {ACCEPTED}")
    command = words[0]
    if command not in COMMANDS:
        known = trl_command_names()
        what = f"trl {command} trains nothing autofit searches" if command in known \
            else f"'{command}' is not a command of trl ({', '.join(known)})"
        raise InputError(f"the launch's {what}: accepted are {ACCEPTED}")
    config, rest = _take(words[1:], ("--config",))
    if config is None:
        raise InputError(f"the launch 'trl {command}' has no --config FILE: autofit reads your run from its config "
                         f"file; accepted are {ACCEPTED}")
    if "--" in rest:  # argparse ends its options there: TRL would refuse what follows (and autofit keeps "--" for
        # accelerate's own options, where a second one read the flags after it as accelerate's: a two-GPU run)
        raise InputError(f"the launch 'trl {command}' has a '--' of its own ({' '.join(rest)}): trl's parser ends its "
                         "options there; give the flags without it")
    accelerate, rest = _take(rest, ("--accelerate_config",))
    values: Dict[str, Any] = {"config": config, "algo": COMMANDS[command]}
    if accelerate is not None:  # named as the user typed it, not as the door's --accelerate-config
        resolve(accelerate, f"trl {command} --accelerate_config")
        values["accelerate_config"] = accelerate
    if rest:
        values["launch_args"] = tuple(rest)
    return values


def _is_trl(word: str) -> bool:
    return os.path.basename(word) == "trl"


def _accelerate(words: List[str]) -> Dict[str, Any]:
    script = next((at for at, word in enumerate(words) if _is_trl(word)), None)
    if script is None:
        raise InputError(f"the launch 'accelerate launch {' '.join(words)}' runs no trl command: accepted are "
                         f"{ACCEPTED}")
    options = [word for word in words[:script] if word not in ("-m", "--module")]
    config_file, options = _take(options, ("--config_file", "--config-file"))
    if config_file is not None:  # named as the user typed it, not as the door's --accelerate-config
        resolve(config_file, "accelerate launch --config_file")
    values = _trl(words[script + 1:], "accelerate launch")
    if config_file is not None and "accelerate_config" not in values:
        values["accelerate_config"] = config_file
    if options:  # accelerate's own, for accelerate's parser only (after "--")
        values["launch_args"] = tuple(values.get("launch_args", ())) + ("--",) + tuple(options)
    return values


def read_command(words: Sequence[str]) -> Dict[str, Any]:
    """The options a launch sets (``config``, ``algo``, ``accelerate_config``, ``launch_args``); ``InputError`` (one
    line naming the part it cannot read and what is accepted) for a launch autofit cannot read."""
    words = list(words)
    if not words:
        raise InputError(f"nothing after --: give your launch, {ACCEPTED}")
    if _is_trl(words[0]):
        return _trl(words[1:], words[0])
    if os.path.basename(words[0]) == "accelerate" and words[1:2] == ["launch"]:
        return _accelerate(words[2:])
    raise InputError(f"the launch '{' '.join(words[:2])}' cannot be read: accepted are {ACCEPTED}")
