"""The ledger effects rungs say themselves (``autofit.rungs.RungBase``): a rung of another package (entry point) or
of the caller (``fit(ladder=[...])``), and the host memory of every rung, built-in or not.

The built-in rungs' ledger effects are modelled through ``Candidate``'s fields (checkpointing, optim, lora, ...):
they say ``modelled``. A rung says its effect through the contract's hooks:

- ``ledger(terms, candidate, model)``: the phase's terms (weights, gradients, optimizer, activations, logits,
  generation, reference; bytes) with the rung's effect, applied to every phase before the allocator's share and the
  context; ``model``: the facts of the candidate's model (``ModelFacts``, built here), so that the rung needs no name
  of the memory model's (a ledger of two arguments, the contract's first form, is called without it);
- ``host_bytes(candidate, model)``: what it keeps in host memory; the built-in offloading rungs answer with the
  memory model's figures the facts carry (``offloaded_optimizer_bytes``, ...);
- ``band``: the relative error band of a prediction for a candidate with the rung (0.5 = ±50 %), where the memory
  model does not describe it (with a ``ledger`` too: a partial description);
- neither (a plain object with ``name``, ``cost``, ``help`` and ``apply``): not modelled, the unchecked band.

A prediction takes the widest band of its rungs, and ``rung_notes`` names each rung that widens it.
"""

from __future__ import annotations

import inspect
import logging
from functools import cached_property
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from autofit.core import Candidate, one_line
from autofit.memory_model._activations import offloaded_activation_bytes
from autofit.memory_model._checked import UNCHECKED_UNCERTAINTY
from autofit.memory_model._offload import optimizer_host_bytes
from autofit.memory_model._parameters import (
    census_for,
    compute_bytes,
    optimizer_state_bytes,
    trainable_tensors,
    weight_bytes,
)
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._sharding import sharding_host_bytes
from autofit.rungs import RungBase, carried_rungs

log = logging.getLogger(__name__)

# The terms a phase has; a rung's ``ledger`` may change these, other keys are ignored.
PHASE_TERMS = ("weights", "gradients", "optimizer", "activations", "logits", "generation", "reference")
_BROKEN: Set[str] = set()  # rungs whose ledger raised: not modelled from then on (said once)
_BROKEN_SPEED: Set[str] = set()  # rungs whose speed raised: said once


class Facts:
    """``autofit.rungs.ModelFacts`` for one candidate on one device (the candidate's by default): what a rung's
    hooks may read of its model, each figure computed when asked."""

    def __init__(self, shape: ModelShape, candidate: Candidate, device: Optional[str] = None):
        self.shape, self.candidate, self.device = shape, candidate, device or candidate.device

    @cached_property
    def parameters(self) -> int:
        return census_for(self.shape, self.candidate.algo).total

    @cached_property
    def parameter_shapes(self) -> Sequence[Tuple[Tuple[int, ...], int]]:
        return [(tuple(group.shape), group.count) for group in census_for(self.shape, self.candidate.algo).params]

    @cached_property
    def trainable_tensors(self) -> Sequence[Tuple[int, int]]:
        return [(t.numel, t.count) for t in trainable_tensors(self.shape, self.candidate)]

    @cached_property
    def weight_bytes(self) -> int:
        return weight_bytes(self.candidate, self.shape)

    def optimizer_state_bytes(self, optim: Optional[str], param_bytes: int) -> float:
        return optimizer_state_bytes(trainable_tensors(self.shape, self.candidate), optim, param_bytes)

    @cached_property
    def offloaded_optimizer_bytes(self) -> float:
        return optimizer_host_bytes(self.candidate, self.shape, self.device)

    @cached_property
    def offloaded_shard_bytes(self) -> float:
        return sharding_host_bytes(self.candidate, self.shape, self.device)

    @cached_property
    def offloaded_activation_bytes(self) -> float:
        act_bytes = compute_bytes(self.candidate, self.shape, self.device)
        return offloaded_activation_bytes(self.candidate, self.shape, act_bytes)


def _takes_the_facts(method: Any) -> bool:
    try:
        return len(inspect.signature(method).parameters) >= 3
    except (TypeError, ValueError):
        return True


def rung_host_bytes(candidate: Candidate, shape: ModelShape, device: str) -> float:
    """What the candidate's rungs keep in host memory on ``device``, as each says (``host_bytes``): the built-in
    offloading rungs and the others alike."""
    total, facts = 0.0, Facts(shape, candidate, device)
    for rung in carried_rungs(candidate):
        method = getattr(rung, "host_bytes", None)
        if method is None or getattr(type(rung), "host_bytes", None) is RungBase.host_bytes:
            continue
        try:
            total += max(0.0, float(method(candidate, facts)))
        except Exception as exc:  # noqa: BLE001 - another package's code: one line, and nothing counted
            log.warning("the host_bytes of the rung %s failed (%s: %s): its host memory is not counted", rung.name,
                        type(exc).__name__, one_line(exc))
    return total


def unmodelled_rungs(candidate: Candidate) -> List[Any]:
    """The candidate's rungs whose ledger effects the memory model does not read from its fields (not ``modelled``):
    each says its effect, or the band it needs."""
    return [rung for rung in carried_rungs(candidate) if not getattr(rung, "modelled", False)]


def _own_ledger(rung: Any) -> bool:
    own = getattr(type(rung), "ledger", None)
    return callable(own) and own is not RungBase.ledger and rung.name not in _BROKEN


def rung_band(rung: Any) -> Optional[float]:
    """The error band a rung needs: none for a ``modelled`` one (a built-in); its ``band``; None when its ``ledger``
    describes it; the unchecked band when it says nothing of its memory."""
    if getattr(rung, "modelled", False):
        return None
    band = getattr(rung, "band", None)
    if band is not None:
        return float(band)
    return None if _own_ledger(rung) else UNCHECKED_UNCERTAINTY


def with_rungs(terms: Dict[str, float], candidate: Candidate, rungs: Iterable[Any], shape: ModelShape
               ) -> Dict[str, float]:
    """One phase's terms with the effect of each rung's own ``ledger``, in the ladder's order."""
    facts = Facts(shape, candidate)
    for rung in rungs:
        if not _own_ledger(rung):
            continue
        try:
            given = (dict(terms), candidate, facts) if _takes_the_facts(rung.ledger) else (dict(terms), candidate)
            changed = dict(rung.ledger(*given))
            terms = {name: max(0.0, float(changed.get(name, 0.0))) for name in PHASE_TERMS
                     if name in terms or name in changed}
        except Exception as exc:  # noqa: BLE001 - another package's code: one line, and the rung is not modelled
            _BROKEN.add(rung.name)
            log.warning("the ledger of the rung %s failed (%s: %s): it is treated as not modelled (±%.0f%%)",
                        rung.name, type(exc).__name__, one_line(exc), 100 * UNCHECKED_UNCERTAINTY)
    return terms


def with_rung_speeds(seconds: Dict[str, float], candidate: Candidate, shape: ModelShape) -> Dict[str, float]:
    """A step's seconds by part with the effect of each of the candidate's rungs that are not ``modelled`` and have a
    ``speed`` of their own, in the ladder's order; one that fails is said once and leaves the seconds as they were."""
    for rung in unmodelled_rungs(candidate):
        own = getattr(type(rung), "speed", None)
        if not callable(own) or own is RungBase.speed:
            continue
        try:
            changed = dict(rung.speed(dict(seconds), candidate, Facts(shape, candidate)))
            seconds = {name: max(0.0, float(value)) for name, value in changed.items()}
        except Exception as exc:  # noqa: BLE001 - another package's code: one line, and its effect left out
            if rung.name not in _BROKEN_SPEED:
                _BROKEN_SPEED.add(rung.name)
                log.warning("the speed of the rung %s failed (%s: %s): its effect on the step is left out", rung.name,
                            type(exc).__name__, one_line(exc))
    return seconds


def widest_band(rungs: Iterable[Any]) -> Tuple[float, List[str]]:
    """The widest band the rungs need (0.0: none), and the names of those that need one."""
    widest, named = 0.0, []
    for rung in rungs:
        band = rung_band(rung)
        if band is not None:
            widest = max(widest, band)
            named.append(rung.name)
    return widest, named


def rung_notes(rungs: Iterable[Any]) -> List[str]:
    """One note per rung of a ladder that the memory model does not describe (``modelled`` rungs: none)."""
    notes = []
    for rung in rungs:
        band = rung_band(rung)
        if band is not None:
            what = "describes its memory in part" if _own_ledger(rung) else "is not modelled (no ledger of its own)"
            notes.append(f"memory model: the rung {rung.name} {what}: predictions with it carry a ±{band:.0%} band "
                         "until probes calibrate them")
    return notes
