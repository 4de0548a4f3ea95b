"""The user's launch as the question's start where the door names an accelerate config and no TRL file (``--model M
--accelerate-config fsdp.yaml``): the baseline (the ladder's first level: its engine and checkpointing) and the notes
of what the memory model does not describe (a TRL file's are ``UserConfig``'s); and, for a search, the launch's
engine package, checked before any probe (a DeepSpeed launch where DeepSpeed is not installed is
one line, exit 4: the estimate predicts it without the package, the probes cannot run it).
"""

from __future__ import annotations

import importlib.util
from typing import Optional, Tuple

from autofit.core import Baseline, SearchOptions
from autofit.rungs import ZERO_STAGES
from autofit.search._accelerate_file import read_accelerate_config
from autofit.search._faults import InfrastructureError
from autofit.search._launch import launch_engine
from autofit.search._user_config import UserConfig, read_user_config


def _user(options: SearchOptions) -> Optional[UserConfig]:
    if not options.config:
        return None
    return read_user_config(options.config, options.algo).at_door(options.accelerate_config)


def launch_baseline(options: SearchOptions) -> Optional[Baseline]:
    """The accelerate config's engine and checkpointing as the run the ladder starts from; None without one."""
    if not options.accelerate_config:
        return None
    door = read_accelerate_config(options.accelerate_config)
    engine = launch_engine({}, {}, {}, door)
    return Baseline(settings=(("checkpointing", engine.checkpointing),), sharding=engine.sharding, source=door["path"])


def launch_notes(options: SearchOptions) -> Tuple[str, ...]:
    """What the accelerate config sets that the memory model does not describe, in one note (the wide band)."""
    if not options.accelerate_config:
        return ()
    door = read_accelerate_config(options.accelerate_config)
    unmodelled = launch_engine({}, {}, {}, door).notes
    if not unmodelled:
        return ()
    return (f"{door['path']} sets what the memory model does not describe ({'; '.join(unmodelled)}): its predictions "
            "there are a guess (the wide band), and the probes measure what they run",)


def check_engine_installed(options: SearchOptions, baseline: Optional[Baseline]) -> None:
    """``InfrastructureError`` (exit 4, before any probe) where the launch runs DeepSpeed and it is not installed."""
    if importlib.util.find_spec("deepspeed") is not None:
        return
    user = _user(options)
    if baseline is not None and baseline.sharding in ZERO_STAGES:
        what = f"{baseline.source}'s engine ({baseline.sharding})"
    elif user is not None and user.training.get("deepspeed"):
        what = f"{options.config}'s deepspeed block"
    else:
        return
    raise InfrastructureError(f"{what} runs DeepSpeed, which is not installed here: a search probes your launch's "
                              "engine (pip install 'trl-autofit[deepspeed]'); autofit estimate predicts it without")
