"""The one place where a probe's errors are classified (the outcomes are ``autofit.core``'s words).

Nothing else in autofit inspects exception types or error strings. A failed probe gets three answers here:

- ``outcome``: what it means for the candidate (OOM: does not fit; INVALID: a combination the libraries refuse;
  CRASH, TIMEOUT: no answer);
- ``fault``: whose problem it is when it is not the candidate's: ``"infrastructure"`` (the machine or the
  environment: a bad fork, no disk space, a CUDA driver that cannot start, a missing package) or ``"user"`` (an
  exception raised by the user's own trainer factory, or a factory that returns something that is not a Trainer) or
  ``"plugin"`` (a rung of another package failed in its own probe-step code: ``PluginStepError``); empty when the
  failure belongs to the candidate;
- ``cause``: a short stable code for the reason (``bad-fork``, ``disk``, ``cuda``, ``import``, ``factory``, ...).

The search stops on a user fault at once and on the same non-memory error for two different candidates; it never
turns such failures into "nothing fits".
"""

from __future__ import annotations

import errno
import signal
import sys
from pathlib import Path
from typing import Optional, Tuple

from autofit.core import INFRASTRUCTURE, PLUGIN, USER, FactoryMisuse, Outcome, PluginStepError, ProbeResult
from autofit.probe._build_locks import STALE_LOCK_CAUSE, stale_build_locks

# Causes (``ProbeResult.cause``).
BAD_FORK = "bad-fork"  # the probe was forked from a process that had initialized CUDA


class BuildTimeout(Exception):
    """Raised in the probe when the factory has not returned the trainer by its deadline."""


# Out-of-memory errors raised outside PyTorch's caching allocator carry no exception type of their own.
_OOM_MARKERS = (
    "out of memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudaerrormemoryallocation",
    "failed to allocate",
)
_BAD_FORK_MARKERS = ("cannot re-initialize cuda in forked subprocess",)
# The GPU, its driver or the CUDA build of torch cannot be used: nothing about the candidate.
_CUDA_MARKERS = (
    "cuda driver",
    "no cuda gpus are available",
    "torch not compiled with cuda enabled",
    "no cuda-capable device",
    "cudaerrornodevice",
    "cudaerrorinsufficientdriver",
    "cuda error: initialization error",
    "cuda error: unknown error",
    "cuda initialization",
    "nvml",
    "found no nvidia driver",
)
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)
# Errors that mean "this combination of settings is not accepted", raised before or while building.
_INVALID_TYPES = (ValueError, TypeError, NotImplementedError, ImportError)
# Frames of these packages are library code: an error raised there is not the user's own.
LIBRARY_PACKAGES = frozenset({
    "autofit", "torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes",
    "tokenizers", "safetensors", "huggingface_hub", "numpy", "pyarrow", "pandas", "optuna", "deepspeed",
    "liger_kernel", "triton", "jinja2", "tqdm", "packaging", "yaml", "filelock", "fsspec", "multiprocess",
})


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".lower()


def _innermost_module(exc: BaseException) -> Optional[str]:
    """The module of the frame that raised ``exc`` (the innermost frame of its traceback)."""
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_globals.get("__name__")


_AUTOFIT_DIR = str(Path(__file__).resolve().parents[1])


def user_file(filename: str) -> bool:
    """A frame's file is the user's own code: not an installed package, the standard library or autofit. Code
    without a file ("<stdin>", ``python -c``'s "<string>", a notebook cell, a factory pickled by value whose file is
    gone) is the user's too; Python's frozen modules are not."""
    if filename.startswith("<"):
        return not filename.startswith("<frozen")
    parts = filename.replace("\\", "/").split("/")
    return not ("site-packages" in parts or "dist-packages" in parts or filename.startswith(_AUTOFIT_DIR)
                or filename.startswith((sys.prefix, sys.base_prefix)))


def raised_by_user_code(exc: BaseException) -> bool:
    """The innermost frame is the user's code: its file (``user_file``), or a module that is neither a library
    autofit knows nor Python's standard library."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None and user_file(tb.tb_frame.f_code.co_filename):
        return True
    module = _innermost_module(exc)
    if not module:
        return False
    top = module.split(".")[0]
    return top not in LIBRARY_PACKAGES and top not in sys.stdlib_module_names and not top.startswith("_")


def _infrastructure_cause(exc: BaseException, text: str) -> Optional[str]:
    if any(marker in text for marker in _BAD_FORK_MARKERS):
        return BAD_FORK
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS or "no space left on device" in text \
            or "file too large" in text or "disk quota exceeded" in text:
        return "disk"
    if any(marker in text for marker in _CUDA_MARKERS):
        return "cuda"
    return None


def classify_exception(exc: BaseException, *, stage: str = "train", user_factory: bool = False
                       ) -> Tuple[Outcome, str, str]:
    """(outcome, fault, cause) of an exception raised in a probe.

    ``stage``: "import" (importing the factory), "setup" (before the factory runs: the random checkpoint, the
    meter), "load" (the factory building the trainer) or "train". ``user_factory``: the factory is the user's own,
    not one of autofit's built-in ``--algo`` factories."""
    import torch

    if isinstance(exc, BuildTimeout):
        return Outcome.TIMEOUT, (USER if user_factory else ""), "build-timeout"
    if isinstance(exc, PluginStepError):
        return Outcome.CRASH, PLUGIN, "plugin-step"
    text = _text(exc)
    if isinstance(exc, torch.OutOfMemoryError) or any(marker in text for marker in _OOM_MARKERS):
        return Outcome.OOM, "", "oom"
    cause = _infrastructure_cause(exc, text)
    if cause is not None:
        return Outcome.CRASH, INFRASTRUCTURE, cause
    if isinstance(exc, MemoryError):  # host memory, not the device's: no answer about the budget
        return Outcome.CRASH, "", "host-memory"
    if stage in ("import", "setup"):
        if stage == "import" and user_factory:
            return Outcome.CRASH, USER, "factory-import"
        kind = "import" if isinstance(exc, ImportError) else stage
        return Outcome.CRASH, INFRASTRUCTURE, kind
    if user_factory and stage == "load":
        if isinstance(exc, FactoryMisuse) or raised_by_user_code(exc):
            return Outcome.CRASH, USER, "factory"
    if isinstance(exc, _INVALID_TYPES):
        return Outcome.INVALID, "", "rejected"
    return Outcome.CRASH, "", "error"


MODEL_PACKAGES = ("transformers", "peft", "bitsandbytes", "safetensors", "huggingface_hub", "accelerate", "torch")


def error_origin(exc: BaseException, stage: str, user_factory: bool) -> str:
    """Where an error came from, for the user: their factory's own code, loading the model, TRL (or transformers)
    validating the config, the training steps, or the probe's setup (before the factory ran)."""
    if stage == "train":
        return "training"
    if stage in ("setup", "import"):
        return "setup" if stage == "setup" else ("importing your factory" if user_factory else "setup")
    module = _innermost_module(exc) or ""
    if user_factory and raised_by_user_code(exc) or isinstance(exc, FactoryMisuse):
        return "your factory"
    if module.split(".")[0] == "trl" or module == "transformers.training_args":
        return "the config's validation"
    if module.split(".")[0] in MODEL_PACKAGES:
        return "the model"
    return "building the trainer"


# The exit status of a probe process that could not create its log (no space or no inodes left): sysexits.h's
# EX_CANTCREAT. It exits quietly with it: its traceback would reach the user's terminal, having nowhere else to go.
CANNOT_CREATE_EXIT = 73


def classify_exit(exitcode: Optional[int], timed_out: bool, phase: str = "", user_factory: bool = False, *,
                  stopped: bool = False, started: Optional[float] = None) -> ProbeResult:
    """A probe that ended without writing its result: killed, hung or crashed hard. ``phase``: the last phase it
    recorded; a process that exited by itself while the user's factory built the trainer (``os._exit`` in it) is
    the factory's doing, not the machine's. ``stopped``: the probe was frozen (SIGSTOP) when its time ran out: the
    machine's doing, like a killed probe server (run once more), not a slow candidate. ``started``: when the probe
    started (``time.time()``): one out of time while a torch extension's build lock older than that is still there
    waited on a killed build's lock (``autofit.probe._build_locks``), the machine's doing too."""
    locks = stale_build_locks(started) if timed_out and not stopped and started is not None else []
    if locks:
        named = ", ".join(str(lock) for lock in locks[:3]) + (f" and {len(locks) - 3} more" if len(locks) > 3 else "")
        return ProbeResult(Outcome.CRASH, error=f"probe ran out of time while a torch extension's build lock older "
                                                f"than the probe was still there ({named}): an interrupted build left "
                                                "it, and every build of that op waits on it", fault=INFRASTRUCTURE,
                           cause=STALE_LOCK_CAUSE)
    if timed_out and stopped:
        return ProbeResult(Outcome.CRASH, error="probe was stopped (SIGSTOP or a debugger froze it) when its time "
                                                "limit came: it was not running, so its time says nothing of the "
                                                "candidate", fault=INFRASTRUCTURE, cause="stopped")
    if timed_out:
        return ProbeResult(Outcome.TIMEOUT, error="probe exceeded its time limit and was killed", cause="timeout")
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.Signals._value2member_map_ else str(-exitcode)
        hint = " (host memory exhausted?)" if -exitcode == signal.SIGKILL else ""
        return ProbeResult(Outcome.CRASH, error=f"probe killed by signal {name}{hint}", fault=INFRASTRUCTURE,
                           cause=f"signal-{name}")
    if exitcode == CANNOT_CREATE_EXIT:
        return ProbeResult(Outcome.CRASH, error="the probe process could not create its log file (no space or no "
                                                "inodes left on the disk of --out?)", fault=INFRASTRUCTURE,
                           cause="disk")
    if user_factory and phase == "load" and exitcode is not None:
        return ProbeResult(Outcome.CRASH, error=f"the probe process exited (code {exitcode}, no exception) while your "
                                                "factory built the trainer: os._exit() or an exit of its own in it?",
                           error_phase="load", fault=USER, cause="factory", origin="your factory")
    return ProbeResult(Outcome.CRASH, error=f"probe exited with code {exitcode} without a result", fault=INFRASTRUCTURE,
                       cause="exit")
