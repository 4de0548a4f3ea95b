"""Probe outcomes: what a probe found (``ProbeResult``), what it means for the candidate (``Outcome``), and whose
fault a failure is when it is not the candidate's (``INFRASTRUCTURE``, ``USER``, ``PLUGIN``). The one place where
errors are classified is the probe's (``autofit.probe._classify``): it runs there.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict


class Outcome(str, enum.Enum):
    OK = "OK"
    OOM = "OOM"  # the configuration does not fit: an infeasible point, not a failure
    INVALID = "INVALID"  # the configuration is rejected by TRL/transformers/peft (bad combination)
    CRASH = "CRASH"  # anything else: a bug, a killed process, a broken CUDA context
    TIMEOUT = "TIMEOUT"


INFRASTRUCTURE = "infrastructure"
USER = "user"
PLUGIN = "plugin"


@dataclass
class ProbeResult:
    outcome: Outcome
    peak_bytes: int = 0
    phase_peaks: Dict[str, int] = field(default_factory=dict)
    tokens_per_second: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    error: str = ""
    error_phase: str = ""
    stats: Dict[str, Any] = field(default_factory=dict)
    config_class: str = ""  # the trainer's config class, e.g. "trl.trainer.sft_config.SFTConfig"
    config_defaults: Dict[str, Any] = field(default_factory=dict)  # its defaults for the keys autofit sets
    fault: str = ""  # "", "infrastructure" or "user" (see the module docstring)
    cause: str = ""
    log_path: str = ""  # the probe's log, for messages that send the user there
    detail: str = ""  # user faults: the traceback frames of the user's own code
    origin: str = ""  # where the error came from: your factory, the model, TRL's validation, training, setup
    # RL: tokens generated per second in the generation phase alone (0 where there is none)
    generation_tokens_per_second: float = 0.0
    observed: Dict[str, Any] = field(default_factory=dict)  # what the built trainer runs (autofit.probe._observe)

    @property
    def fits(self) -> bool:
        return self.outcome is Outcome.OK

    def signature(self) -> str:
        """What makes two failures "the same error": outcome, phase and message, numbers and paths aside."""
        message = re.sub(r"(/[^\s:'\"]+)+", "PATH", self.error)
        message = re.sub(r"0x[0-9a-fA-F]+|\d+(\.\d+)?", "N", message)
        return f"{self.outcome.value}|{self.error_phase}|{message}"

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> ProbeResult:
        """A stored result, checked field by field (a damaged or edited study must not become an answer): raises
        ``ValueError`` naming the first field that is not what a probe writes."""
        if not isinstance(data, dict):
            raise ValueError(f"a result is a JSON object, not {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        data = {key: value for key, value in data.items() if key in known}
        data["outcome"] = Outcome(data.get("outcome"))
        for name, value in data.items():
            expected = _FIELD_TYPES.get(name)
            if expected is not None and (isinstance(value, bool) and bool not in expected
                                         or not isinstance(value, expected)):
                raise ValueError(f"result field {name!r} is {type(value).__name__}, not {expected[0].__name__}")
        if data.get("peak_bytes", 0) < 0 or any(not isinstance(v, int) or isinstance(v, bool) or v < 0
                                                 for v in data.get("phase_peaks", {}).values()):
            raise ValueError("result peaks must be whole numbers of bytes, 0 or more")
        return cls(**data)


_FIELD_TYPES = {
    "peak_bytes": (int,), "phase_peaks": (dict,), "tokens_per_second": (float, int), "steps": (int,),
    "seconds": (float, int), "error": (str,), "error_phase": (str,), "stats": (dict,), "config_class": (str,),
    "config_defaults": (dict,), "fault": (str,), "cause": (str,), "log_path": (str,), "detail": (str,),
    "origin": (str,), "generation_tokens_per_second": (float, int), "observed": (dict,),
}


class PluginStepError(RuntimeError):
    """The probe step of another package's rung raised in its own code, or could not be imported: that package's
    fault, its message one line naming the package (the search stops on it: exit 2)."""


class FactoryMisuse(TypeError):
    """Raised by the probe worker when a factory's return value cannot be what the candidate asked for."""

