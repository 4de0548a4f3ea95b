"""The probe steps of the built-in rungs, and how the probe's child finds the steps of a ladder's rungs.

A step (``autofit.rungs.ProbeStep``) is what a rung does inside the probe: before the trainer is built, around
building and training, once it is built, after training, and with a failure that is the rung's own. A rung names
its step by a ``"module:attribute"`` path (``probe_step``); the child, a fresh process, imports it by that path:
the built-in rungs' always (a candidate can carry their fields without the rung's name, from a user's own config),
the ladder's other rungs' as ``ProbeSettings.rung_steps`` tells it, and the one step of no rung's, the environment
of the user's own DeepSpeed run.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import tempfile
from pathlib import Path
from typing import Any, ContextManager, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from autofit.core import ENGINE_FAILURE, INFRASTRUCTURE, KERNEL_FAILURE, USER, Candidate, Outcome
from autofit.probe import _activation_offload as activation_offload
from autofit.probe import _kernels as kernels
from autofit.probe import _simulated_fsdp as simulated_fsdp
from autofit.probe._offloaded import offloaded_state
from autofit.rungs import (
    DEFAULT_LADDER,
    FSDP_ENGINES,
    ProbeStep,
    launch_env,
    probe_steps,
    process_env,
    write_engine_files,
)

# Steps of no rung's, considered by every probe.
NO_RUNGS = ("autofit.probe._steps:OwnDeepSpeedStep",)


class EngineStep(ProbeStep):
    """An engine (optimizer offload, a sharding, data parallel across ranks): its files and launch environment before
    the trainer is built, FSDP2 across the simulated device's ranks around it, the state it offloads read back. A
    crash under it is the rung's (like a config TRL rejects), not the search's."""

    stage = "load"  # the engine's failures belong to the rung, not to the machine

    def active(self, candidate: Candidate) -> bool:
        return bool(candidate.engine)

    def before_build(self, candidate: Candidate) -> None:
        enter_engine(candidate)

    def around(self, candidate: Candidate, meter: Any) -> ContextManager[Any]:
        if candidate.device == "cpu" and candidate.engine in FSDP_ENGINES:
            return simulated_fsdp.instrumented(meter)
        return contextlib.nullcontext()

    def read_back(self, trainer: Any, candidate: Candidate, meter: Any, handle: Any,
                  observed: Dict[str, Any]) -> Dict[str, Any]:
        return {"host_bytes": offloaded_state(trainer, candidate, meter)} if candidate.offload else {}

    def failure(self, candidate: Candidate, outcome: Outcome, fault: str, cause: str) -> Optional[Tuple[Outcome, str]]:
        if outcome is Outcome.CRASH and fault not in (USER, INFRASTRUCTURE):
            return Outcome.INVALID, ENGINE_FAILURE
        return None


def enter_engine(candidate: Candidate) -> None:
    """Write the engine's files (as the export will) and take the environment ``accelerate launch`` would give."""
    assert candidate.engine is not None  # entered only for a candidate with an engine
    folder = Path(candidate.probe.output_dir) / "engine" if candidate.probe else Path(tempfile.mkdtemp())
    files = write_engine_files(folder, candidate.engine, candidate.device, candidate.ranks)
    os.environ.update(launch_env(files["accelerate"], candidate.device, candidate.engine))


class OwnDeepSpeedStep(ProbeStep):
    """No rung's: the user's own DeepSpeed run (``deepspeed:`` in their config), launched as TRL's CLI would."""

    def active(self, candidate: Candidate) -> bool:
        return not candidate.engine and bool(dict(candidate.user_args).get("deepspeed"))

    def before_build(self, candidate: Candidate) -> None:
        os.environ.update(process_env(candidate.device))


class LigerStep(ProbeStep):
    """Liger's kernels: the trainer's config must ask for them; after training, the modules they patched. A probe
    they break (or a transformers that refuses the package) is the rung's: the search goes on without them."""

    def active(self, candidate: Candidate) -> bool:
        return candidate.liger

    def after_build(self, trainer: Any, candidate: Candidate, observed: Dict[str, Any]) -> None:
        kernels.check_liger_flag(trainer)

    def read_back(self, trainer: Any, candidate: Candidate, meter: Any, handle: Any,
                  observed: Dict[str, Any]) -> Dict[str, Any]:
        observed["liger_modules"] = kernels.liger_patched(trainer)
        return {}

    def failure(self, candidate: Candidate, outcome: Outcome, fault: str, cause: str) -> Optional[Tuple[Outcome, str]]:
        # an ImportError of the package, INVALID otherwise, would read as the trainer rejecting the configuration
        if outcome in (Outcome.CRASH, Outcome.INVALID) and fault not in (USER, INFRASTRUCTURE):
            return Outcome.INVALID, KERNEL_FAILURE
        return None


class ActivationOffloadStep(ProbeStep):
    """TRL's activation offloading: its host copies counted around training (on the simulated device, TRL's code made
    to run there), their peak read back."""

    def active(self, candidate: Candidate) -> bool:
        return candidate.activation_offload

    def around(self, candidate: Candidate, meter: Any) -> ContextManager[Any]:
        return activation_offload.instrumented(meter, candidate.device == "cpu")

    def read_back(self, trainer: Any, candidate: Candidate, meter: Any, handle: Any,
                  observed: Dict[str, Any]) -> Dict[str, Any]:
        return {"activation_host_bytes": activation_offload.offloaded_activations(trainer, handle, meter)}


def considered(candidate: Candidate) -> List[ProbeStep]:
    """The steps a probe of ``candidate`` considers, in order: the built-in rungs', those of the ladder's other rungs
    (``ProbeSettings.rung_steps``), then those of no rung's; each path once, knowing the names of its rungs."""
    told = candidate.probe.rung_steps if candidate.probe is not None else ()
    rungs: Dict[str, Set[str]] = {}
    for name, path in (*probe_steps(DEFAULT_LADDER), *told, *(("", path) for path in NO_RUNGS)):
        rungs.setdefault(path, set()).update({name} if name else set())
    return [load(path, frozenset(names)) for path, names in rungs.items()]


def load(path: str, rungs: FrozenSet[str] = frozenset()) -> ProbeStep:
    """The step at ``path`` (``"module:attribute"``: a ``ProbeStep`` subclass or instance); an error of one line
    naming the path when it cannot be imported."""
    module, _, attribute = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except Exception as exc:  # noqa: BLE001 - whatever the module raises, the message names the step
        raise ImportError(f"the probe step {path!r} cannot be imported: {type(exc).__name__}: {exc}") from exc
    step = found() if isinstance(found, type) else found
    if not isinstance(step, ProbeStep):
        raise TypeError(f"the probe step {path!r} is a {type(step).__name__}, not an autofit.rungs.ProbeStep")
    step.rungs = step.rungs | rungs
    return step


def claimed(steps: Sequence[ProbeStep], candidate: Candidate, outcome: Outcome, fault: str, cause: str
            ) -> Tuple[Outcome, str]:
    """A failure's outcome and cause, once the active steps have had their say: the last step first, the first answer
    kept."""
    for step in reversed(steps):
        answer = step.failure(candidate, outcome, fault, cause)
        if answer is not None:
            return answer
    return outcome, cause
