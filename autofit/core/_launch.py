"""The user's launch as read once at the door (``autofit.launch.read_launch``), plain data that travels on the
``SearchSpec``: the TRL config file as TRL parsed it (``TrlFile``), the accelerate config given at the door, and the
engine, processes and machines the launch runs (``LaunchEngine``). No stage reads the files again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from autofit.core._knob import FileRun


@dataclass(frozen=True)
class TrlFile:
    """One config file as ``trl <algo> --config`` parsed it: the fields of its dataclasses (``training``: the
    trainer's config class, ``model``: ModelConfig, ``script``: the script's arguments), the keys the file writes (the
    launch's own flags folded in), and its text (what best.yaml edits)."""

    path: str
    algo: str
    text: str
    training: Dict[str, Any] = field(default_factory=dict)
    model: Dict[str, Any] = field(default_factory=dict)
    script: Dict[str, Any] = field(default_factory=dict)
    written: Dict[str, Any] = field(default_factory=dict)
    defaults: Dict[str, Any] = field(default_factory=dict)  # the config classes' defaults of the keys written
    launch: Dict[str, Any] = field(default_factory=dict)  # what the launch tells accelerate (``_trl_config``)
    flagged: Dict[str, Any] = field(default_factory=dict)  # the keys the launch's flags set, not the file
    # the values a written key's field takes where it declares a fixed set (its metadata's "choices"): TRL's argparse
    # checks them on its command line, never on a config file's values
    choices: Dict[str, Tuple[str, ...]] = field(default_factory=dict)

    def wrote(self, key: str) -> bool:
        return key in self.written

    def where(self, key: str) -> str:
        """Where the user wrote ``key``, for a message: the launch's flag, else the file's key."""
        if key in self.flagged:
            return f"the launch's flag --{key}"
        return f"--config {self.path}: {key}"

    @property
    def run(self) -> FileRun:
        """The file as the knobs read it (``autofit.core._knobs``)."""
        return FileRun(self.training, self.model, self.written, self.algo)


@dataclass(frozen=True)
class LaunchEngine:
    sharding: Optional[str] = None  # the candidate's engine (``autofit.core._engines``); None: data parallel
    processes: Optional[int] = None  # num_processes of the launch (GPUs per machine)
    machines: Optional[int] = None
    source: str = ""  # where it came from, in the user's words
    notes: Tuple[str, ...] = ()
    checkpointing: bool = False  # FSDP's activation checkpointing (the plugin's, or fsdp_config's)
    mixed_precision: Optional[str] = None  # the accelerate config's: "no", "fp16", "bf16" (None: not said)


@dataclass(frozen=True)
class Launch:
    """The user's launch: its TRL file (None: none given), the accelerate config given at the door
    (``--accelerate-config``: ``{"path", "values"}``, over the file's own), and the engine it runs."""

    file: Optional[TrlFile] = None
    accelerate: Optional[Dict[str, Any]] = None
    engine: LaunchEngine = LaunchEngine()

    @property
    def source(self) -> str:
        """The launch's file, for messages: the TRL file, else the accelerate config."""
        if self.file is not None:
            return self.file.path
        return str(self.accelerate["path"]) if self.accelerate else ""
