"""Probe outcomes and the one place where errors are classified.

Nothing else in autofit inspects exception types or error strings.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional


class Outcome(str, enum.Enum):
    OK = "OK"
    OOM = "OOM"  # the configuration does not fit: an infeasible point, not a failure
    INVALID = "INVALID"  # the configuration is rejected by TRL/transformers/peft (bad combination)
    CRASH = "CRASH"  # anything else: a bug, a killed process, a broken CUDA context
    TIMEOUT = "TIMEOUT"


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

    @property
    def fits(self) -> bool:
        return self.outcome is Outcome.OK

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "ProbeResult":
        data = dict(data)
        data["outcome"] = Outcome(data["outcome"])
        return cls(**data)


# Out-of-memory errors raised outside PyTorch's caching allocator carry no exception type of their own.
_OOM_MARKERS = (
    "out of memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudaerrormemoryallocation",
    "failed to allocate",
)
# Errors that mean "this combination of settings is not accepted", raised before or while building.
_INVALID_TYPES = (ValueError, TypeError, NotImplementedError, ImportError)


def classify_exception(exc: BaseException) -> Outcome:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return Outcome.OOM
    text = f"{type(exc).__name__}: {exc}".lower()
    if any(marker in text for marker in _OOM_MARKERS):
        return Outcome.OOM
    if isinstance(exc, _INVALID_TYPES):
        return Outcome.INVALID
    return Outcome.CRASH


def classify_exit(exitcode: Optional[int], timed_out: bool) -> ProbeResult:
    """A probe that ended without writing its result: killed, hung or crashed hard."""
    if timed_out:
        return ProbeResult(Outcome.TIMEOUT, error="probe exceeded its time limit and was killed")
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.Signals._value2member_map_ else str(-exitcode)
        hint = " (host memory exhausted?)" if -exitcode == signal.SIGKILL else ""
        return ProbeResult(Outcome.CRASH, error=f"probe killed by signal {name}{hint}")
    return ProbeResult(Outcome.CRASH, error=f"probe exited with code {exitcode} without a result")
