"""The user's TRL config file (``--config FILE``), read as ``trl <algo> --config FILE`` reads it, once, at the door.

The file is read by autofit, in the search's process, with limits (``autofit.launch._config_file``: a regular file or
a pipe's content, its size, its YAML aliases, no key twice), and that text is what TRL's parser and the export read:
``--config <(cat sft.yaml)`` works. TRL's parser imports torch, so it runs in a process of its own
(``autofit.probe._trl_config``, forked from the probe server: ``autofit.probe.read_trl_config``), given the text on
its standard input, with the launch's own flags after the file (``autofit search -- trl sft --config F --flag v``),
which are folded into the file's text (``autofit.launch._flags``). Its errors are TRL's own messages, one line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any, Dict, Optional, Sequence, Tuple

import yaml

from autofit.core import ALGORITHMS, InputError, TrlFile, one_line
from autofit.launch._accelerate_file import check_deepspeed_argument
from autofit.launch._config_file import read_config_text
from autofit.launch._flags import fold_flags
from autofit.probe import WORLD_SIZE_ENV, read_trl_config

READ_TIMEOUT_S = 300
READABLE_ALGOS = tuple(a.name for a in ALGORITHMS.values() if a.trl_command)  # the trainers `trl` has a command for


CLOCK_DEFAULTS = ("logging_dir",)  # training arguments whose default is computed from the time of reading

def read_trl_file(path: str, algo: str, args: Sequence[str] = (), world_size: Optional[int] = None) -> TrlFile:
    """The file as ``trl <algo> --config FILE ARGS`` reads it in each of ``world_size`` processes (None: the launch's
    own ``num_processes``, or 1); ``InputError`` with TRL's message (one line) when it refuses."""
    if algo not in READABLE_ALGOS:
        raise InputError(f"--config reads a file of the trl command's trainers ({', '.join(READABLE_ALGOS)}), "
                         f"not of '{algo}'")
    return _parse(path, algo, read_config_text(path), tuple(args), world_size)


def _parse(path: str, algo: str, text: str, flags: Tuple[str, ...] = (), world_size: Optional[int] = None) -> TrlFile:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop(WORLD_SIZE_ENV, None)
    if world_size is not None:
        env[WORLD_SIZE_ENV] = str(world_size)
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
        _check_written_deepspeed(path, text)  # TRL's own failure there is an AttributeError deep in transformers
        raise InputError(_flags_refused(data, algo, flags, done.stderr) or f"--config {path}: "
                         + _refusal(done, data, algo))
    fields = data["fields"]
    text, flagged = fold_flags(text, path, flags, fields)  # the launch's flags, written into its file
    written = {**data.get("written", {}), **flagged}
    # transformers < 5 defaults logging_dir to a folder named by the clock: the same file read a second later would
    # be another question
    training = {key: value for key, value in fields.get("training", {}).items()
                if key not in CLOCK_DEFAULTS or key in written}
    return TrlFile(path=path, algo=algo, text=text, training=training,
                   model=fields.get("model", {}), script=fields.get("script", {}),
                   written=written, defaults=data.get("defaults", {}),
                   launch=data.get("launch") or {}, flagged=flagged,
                   choices={key: tuple(values) for key, values in (data.get("choices") or {}).items()})


def _check_written_deepspeed(path: str, text: str) -> None:
    """The file's ``deepspeed`` (its mapping or JSON file) checked as the door checks it, naming the key TRL's parser
    failed on."""
    try:
        written = yaml.safe_load(text)
    except yaml.YAMLError:  # TRL's parser says where
        return
    if isinstance(written, dict):
        check_deepspeed_argument(written.get("deepspeed"), path)


def _flags_refused(data: Dict[str, Any], algo: str, flags: Tuple[str, ...], stderr: str = "") -> str:
    """The refusal of options the launch typed, not the file wrote (TRL's parser says "from config file" of both,
    and argparse's "argument --x" of accelerate's own), named as typed: accelerate's after its ``--``, TRL's before;
    empty where the file wrote one of them."""
    split = flags.index("--") if "--" in flags else len(flags)
    trl, accelerate = set(flags[:split]), set(flags[split + 1:])
    typed = {word.split("=", 1)[0] for word in flags if word.startswith("--")}
    refused = [line.split("error:", 1)[1].strip() for line in stderr.splitlines() if "error: argument --" in line]
    if refused:  # argparse refused a value: "argument --mixed_precision: invalid choice: 'bf17' (...)"
        name = refused[-1].split()[1].split("/")[0].rstrip(":")
        if name in typed:
            who = "accelerate launch" if any(w.split("=", 1)[0] == name for w in flags[split + 1:]) else \
                f"the launch's flag (trl {algo})"
            return f"{who} {one_line(refused[-1].split(' ', 1)[1])}"
    unknown = re.findall(r"'(--[^']+)'", str(data.get("error", ""))) if "Unknown arguments" in str(data.get("error")) \
        else []
    if not unknown or not all(name in trl or name in accelerate for name in unknown):
        return ""
    return "; ".join(f"accelerate launch {name}: not an option accelerate launch takes" if name in accelerate else
                     f"the launch's flag {name}: not an option TRL's {algo} command takes" for name in unknown)


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
