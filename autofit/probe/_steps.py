"""How the probe's child finds the probe steps of a ladder's rungs, and asks them about a failure.

A step (``autofit.rungs.ProbeStep``) is what a rung does inside the probe: before the trainer is built, around
building and training, once it is built, after training, and with a failure that is the rung's own. A rung keeps its
step beside it (a rung with child-side code is a folder: ``autofit/rungs/liger/_probe.py``, ...) and names it by a
``"module:attribute"`` path (``probe_step``); the child, a fresh process, imports it by that path:
the built-in rungs' always (a candidate can carry their fields without the rung's name, from a user's own config),
the ladder's other rungs' as ``ProbeSettings.rung_steps`` tells it, and the one step of no rung's, the environment
of the user's own DeepSpeed run.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, FrozenSet, List, Sequence, Set, Tuple

from autofit.core import PLUGIN, Candidate, FactoryMisuse, Outcome, PluginStepError, one_line
from autofit.probe._classify import classify_exception
from autofit.rungs import DEFAULT_LADDER, ProbeStep, hook_problem, package_of, probe_steps

# Steps of no rung's, considered by every probe.
NO_RUNGS = ("autofit.rungs.engines._probe:OwnDeepSpeedStep",)


def considered(candidate: Candidate) -> List[ProbeStep]:
    """The steps a probe of ``candidate`` considers, in order: the built-in rungs', those of the ladder's other rungs
    (``ProbeSettings.rung_steps``), then those of no rung's; each path once, knowing the names of its rungs."""
    told = candidate.probe.rung_steps if candidate.probe is not None else ()
    rungs: Dict[str, Set[str]] = {}
    for name, path in (*probe_steps(DEFAULT_LADDER), *told, *(("", path) for path in NO_RUNGS)):
        rungs.setdefault(path, set()).update({name} if name else set())
    return [load(path, frozenset(names)) for path, names in rungs.items()]


def _is_autofits(module: str) -> bool:
    return module.split(".")[0] == "autofit"


def _plugin_failure(path: str, rungs: FrozenSet[str], what: str, exc: BaseException) -> PluginStepError:
    """One line naming the rung and the package that offers it (as the search's process names it), else the
    step's module."""
    name = sorted(rungs)[0] if rungs else None
    package = (package_of(name) if name else None) or f"module {path.partition(':')[0]}"
    return PluginStepError(f"{f'rung {name!r}' if name else 'a rung'} of {package}: its probe step {path} {what}: "
                           f"{type(exc).__name__}: {one_line(exc)}")


def call(step: ProbeStep, hook: str, *args: Any, enter_into: Any = None) -> Any:
    """A step's hook, called (``around``'s manager entered into the ``enter_into`` stack); another package's step
    raising in its own code is that package's fault (``PluginStepError``), but for an out-of-memory (an answer about
    the candidate) and a factory that ignored the candidate (the user's)."""
    try:
        answer = getattr(step, hook)(*args)
        return enter_into.enter_context(answer) if enter_into is not None else answer
    except Exception as exc:
        if _is_autofits(type(step).__module__) or isinstance(exc, FactoryMisuse) \
                or classify_exception(exc)[0] is Outcome.OOM:
            raise
        path = f"{type(step).__module__}:{type(step).__qualname__}"
        raise _plugin_failure(path, step.rungs, f"failed in {hook}()", exc) from exc


def load(path: str, rungs: FrozenSet[str] = frozenset()) -> ProbeStep:
    """The step at ``path`` (``"module:attribute"``: a ``ProbeStep`` subclass or instance); an error of one line
    naming the path when it cannot be imported (a missing module: the machine's, "install the missing package")."""
    module, _, attribute = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except Exception as exc:  # noqa: BLE001 - whatever the module raises, the message names the step
        raise ImportError(f"the probe step {path!r} cannot be imported: {type(exc).__name__}: {exc}") from exc
    step = found() if isinstance(found, type) else found
    if not isinstance(step, ProbeStep):
        raise TypeError(f"the probe step {path!r} is a {type(step).__name__}, not an autofit.rungs.ProbeStep")
    problem = hook_problem(step, ProbeStep)
    if problem:
        raise TypeError(f"the probe step {path!r}: {problem}")
    step.rungs = step.rungs | rungs
    return step


def claimed(steps: Sequence[ProbeStep], candidate: Candidate, outcome: Outcome, fault: str, cause: str
            ) -> Tuple[Outcome, str]:
    """A failure's outcome and cause, once the active steps have had their say: the last step first, the first answer
    kept. A plugin's own failure is not theirs to claim."""
    if fault == PLUGIN:
        return outcome, cause
    for step in reversed(steps):
        answer = step.failure(candidate, outcome, fault, cause)
        if answer is not None:
            return answer
    return outcome, cause
