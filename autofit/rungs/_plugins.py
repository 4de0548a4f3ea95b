"""Rungs of other installed packages, found through the ``autofit.rungs`` entry point group.

A package offers a rung as pytest plugins and Optuna's integrations are offered, in its ``pyproject.toml``::

    [project.entry-points."autofit.rungs"]
    adafactor = "autofit_adafactor:Adafactor"

The entry point's name is the rung's name (what ``--ladder`` and ``fit(ladder=[...])`` say); its object is a rung, or
a class whose instance (made without arguments) is one. Decisions (docs/ladder.md, "Rungs of other packages"):

- used when named, never in the default ladder: a package installed for something else does not change a search
  that did not ask for it (Optuna's integrations, not pytest's always-on plugins); ``--help`` lists the names;
- imported when named: reading the names reads only the packages' metadata, so a broken package that is not named
  costs nothing;
- a package whose rung cannot be used (it does not import, its object is not a rung, it calls itself by another name,
  two packages offer the name) is one line naming the package and what is wrong: named in the ladder, the search is
  refused with it (exit 2); met otherwise (the words of a stored candidate), it is logged once and the rung is
  treated as unknown;
- a built-in rung's name: the built-in is used, and the package's entry is ignored with a logged note (a package
  never changes what a built-in name means);
- its own code failing in a search is one line naming the package too (``_guarded``).
"""

from __future__ import annotations

import functools
import logging
import sys
from importlib import metadata
from typing import Any, Callable, Dict, List, Optional, Tuple

from autofit.core import InputError, one_line
from autofit.rungs._contract import RungBase, hook_problem
from autofit.rungs._ladder import COSTS, LadderState, Rung

log = logging.getLogger(__name__)

GROUP = "autofit.rungs"


class PluginError(InputError):
    """A rung of another package that cannot be used: one line naming the package and what is wrong (exit 2)."""


def _package(entry: Any) -> str:
    dist = getattr(entry, "dist", None)
    if dist is None:
        return "an unknown package"
    return f"package {dist.metadata['Name'] or dist.name} {dist.version}"


_FOUND: Dict[Tuple[str, ...], Dict[str, List[Any]]] = {}  # sys.path -> entry points by name
_LOADED: Dict[Tuple[Any, ...], Any] = {}  # (sys.path, name) -> the rung, or the PluginError that says why not
_SAID: set = set()  # notes logged once


def offered(builtin: Callable[[str], bool] = lambda name: False) -> Dict[str, List[Any]]:
    """The entry points of the ``autofit.rungs`` group by name, read from the installed packages' metadata (nothing
    is imported); a name ``builtin`` claims is left out, with a logged note."""
    key = tuple(sys.path)
    if key not in _FOUND:
        found: Dict[str, List[Any]] = {}
        try:
            entries = list(metadata.entry_points(group=GROUP))
        except Exception as exc:  # noqa: BLE001 - a package's damaged metadata: no plugin rung, a note
            log.warning("the installed packages' entry points (%s) could not be read: %s: %s", GROUP,
                        type(exc).__name__, one_line(exc))
            entries = []
        for entry in entries:
            found.setdefault(entry.name, []).append(entry)
        _FOUND[key] = found
    found = dict(_FOUND[key])
    for name in [n for n in found if builtin(n)]:
        _say(f"the rung '{name}' of {', '.join(_package(e) for e in found.pop(name))} (entry point {GROUP}) is "
             "ignored: autofit has a built-in rung of that name")
    return found


def package_of(name: str) -> Optional[str]:
    """The package that offers the rung ``name`` (``package autofit-broken 0.1``), None where none does."""
    entries = offered().get(name)
    return _package(entries[0]) if entries else None


def load(name: str, entries: List[Any]) -> Rung:
    """The rung an entry point offers; ``PluginError`` (one line naming the package) when it cannot be used."""
    key = (tuple(sys.path), name)
    if key not in _LOADED:
        try:
            _LOADED[key] = _load(name, entries)
        except PluginError as exc:
            _LOADED[key] = exc
    found = _LOADED[key]
    if isinstance(found, PluginError):
        raise found
    return found


def load_quietly(name: str, entries: List[Any]) -> Optional[Rung]:
    """``load``, or None with the reason logged once (a stored candidate's rung: nothing to refuse)."""
    try:
        return load(name, entries)
    except PluginError as exc:
        _say(f"{exc}: treated as a rung autofit does not know")
        return None


def _load(name: str, entries: List[Any]) -> Rung:
    if len(entries) > 1:
        raise PluginError(f"rung '{name}' is offered by {' and '.join(_package(e) for e in entries)} (entry point "
                          f"{GROUP}): uninstall one of them")
    entry = entries[0]
    where = f"rung '{name}' of {_package(entry)} (entry point {GROUP}: {name} = {entry.value})"
    try:
        found = entry.load()
    except Exception as exc:  # noqa: BLE001 - anything the package's import raises is the package's, said in a line
        raise PluginError(f"{where} cannot be imported: {type(exc).__name__}: {one_line(exc)}") from None
    if isinstance(found, type):
        try:
            found = found()
        except Exception as exc:  # noqa: BLE001 - as above
            raise PluginError(f"{where} cannot be made: {type(exc).__name__}: {one_line(exc)}") from None
    missing = [part for part in ("name", "cost", "help") if not isinstance(getattr(found, part, None), str)]
    if missing or not callable(getattr(found, "apply", None)):
        lacks = ", ".join(missing + ([] if callable(getattr(found, "apply", None)) else ["apply()"]))
        raise PluginError(f"{where} is not a rung: {type(found).__name__} has no {lacks}")
    if found.name != name:
        raise PluginError(f"{where} calls itself '{found.name}': the entry point's name must be the rung's")
    if found.cost not in COSTS:
        raise PluginError(f"{where} has the cost class '{found.cost}': accepted are {', '.join(COSTS)}")
    problem = hook_problem(found, RungBase)
    if problem:
        raise PluginError(f"{where}: {problem}")
    return _guarded(found, f"rung '{name}' of {_package(entry)}")


def _guarded(rung: Any, where: str) -> Any:
    """The rung with its own code answering in one line that names its package, never a traceback mid-search:
    ``apply`` failing stops the search with that line (exit 2); its words failing say nothing (logged once); its
    ``unavailable`` failing leaves it out, the failure as the reason. (Its ``ledger``: ``autofit.memory_model``.)"""
    for attr in ("apply", "trade", "comment", "unavailable"):
        method = getattr(rung, attr, None)
        if callable(method):
            try:
                setattr(rung, attr, _answering(method, attr, where))
            except (AttributeError, TypeError):  # __slots__ or a frozen class: its own code answers as it is
                pass
    return rung


def _answering(method: Callable[..., Any], attr: str, where: str) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - another package's code: one line naming it
            failed = f"its {attr}() failed: {type(exc).__name__}: {one_line(exc)}"
            if attr == "unavailable":
                return failed
            if attr in ("trade", "comment"):
                _say(f"{where}: {failed}: it says nothing there")
                return None
            raise PluginError(f"{where}: {failed}") from None

    if attr != "apply":
        return call

    @functools.wraps(method)
    def apply(*args: Any, **kwargs: Any) -> Any:
        state = call(*args, **kwargs)
        problem = answer_problem(state)
        if problem:
            raise PluginError(f"{where}: its apply() {problem}")
        return state

    return apply


def answer_problem(state: Any) -> Optional[str]:
    """What is wrong with a rung's answer, or None: ``apply`` answers None or a ``LadderState`` whose candidate's
    sizes are positive whole numbers (a micro-batch of -1 had been probed as mb=-1x-8)."""
    if state is None:
        return None
    if not isinstance(state, LadderState):
        return f"returned {type(state).__name__}, not None or a LadderState (state.with_rung(...))"
    candidate = state.candidate
    for size in ("micro_batch", "grad_accum", "max_length"):
        value = getattr(candidate, size, None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"set {size} to {value!r}: a positive whole number is accepted"
    return None


def _say(note: str) -> None:
    if note not in _SAID:
        _SAID.add(note)
        log.warning("%s", note)
