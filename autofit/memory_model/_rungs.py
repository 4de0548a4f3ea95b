"""The ledger effect of the rungs autofit does not build in: a rung of another package (entry point) or of the caller
(``fit(ladder=[...])``).

The built-in rungs are modelled through ``Candidate``'s fields (checkpointing, optim, lora, ...). A rung that is not
built in says its effect itself (``autofit.rungs.RungBase``):

- ``ledger(terms, candidate)``: the phase's terms (weights, gradients, optimizer, activations, logits, generation,
  reference; bytes) with the rung's effect, applied to every phase before the allocator's share and the context;
- ``band``: the relative error band of a prediction for a candidate with the rung (0.5 = ±50 %), where the memory
  model does not describe it (with a ``ledger`` too: a partial description);
- neither (a plain object with ``name``, ``cost``, ``help`` and ``apply``): not modelled, the unchecked band.

A prediction takes the widest band of its rungs, and ``rung_notes`` names each rung that widens it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Set, Tuple

from autofit.core import one_line
from autofit.memory_model._checked import UNCHECKED_UNCERTAINTY
from autofit.rungs import RungBase, is_builtin, rung_named

if TYPE_CHECKING:
    from autofit.core import Candidate

log = logging.getLogger(__name__)

# The terms a phase has; a rung's ``ledger`` may change these, other keys are ignored.
PHASE_TERMS = ("weights", "gradients", "optimizer", "activations", "logits", "generation", "reference")
_BROKEN: Set[str] = set()  # rungs whose ledger raised: not modelled from then on (said once)


def custom_rungs(candidate: Candidate) -> List[Any]:
    """The candidate's rungs that are not built in, as objects (a name no rung has any more is left out: a stored
    candidate's)."""
    found = []
    for name in candidate.rungs:
        if not is_builtin(name):
            rung = rung_named(name)
            if rung is not None:
                found.append(rung)
    return found


def _own_ledger(rung: Any) -> bool:
    own = getattr(type(rung), "ledger", None)
    return callable(own) and own is not RungBase.ledger and rung.name not in _BROKEN


def rung_band(rung: Any) -> Optional[float]:
    """The error band a rung that is not built in needs: its ``band``; None when its ``ledger`` describes it; the
    unchecked band when it says nothing of its memory."""
    band = getattr(rung, "band", None)
    if band is not None:
        return float(band)
    return None if _own_ledger(rung) else UNCHECKED_UNCERTAINTY


def with_rungs(terms: Dict[str, float], candidate: Candidate, rungs: Iterable[Any]) -> Dict[str, float]:
    """One phase's terms with the effect of each rung's own ``ledger``, in the ladder's order."""
    for rung in rungs:
        if not _own_ledger(rung):
            continue
        try:
            changed = dict(rung.ledger(dict(terms), candidate))
            terms = {name: max(0.0, float(changed.get(name, 0.0))) for name in PHASE_TERMS
                     if name in terms or name in changed}
        except Exception as exc:  # noqa: BLE001 - another package's code: one line, and the rung is not modelled
            _BROKEN.add(rung.name)
            log.warning("the ledger of the rung %s failed (%s: %s): it is treated as not modelled (±%.0f%%)",
                        rung.name, type(exc).__name__, one_line(exc), 100 * UNCHECKED_UNCERTAINTY)
    return terms


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
    """One note per rung of a ladder that the memory model does not describe (built-in rungs: none)."""
    notes = []
    for rung in rungs:
        band = None if is_builtin(rung.name) else rung_band(rung)
        if band is not None:
            what = "describes its memory in part" if _own_ledger(rung) else "is not modelled (no ledger of its own)"
            notes.append(f"memory model: the rung {rung.name} {what}: predictions with it carry a ±{band:.0%} band "
                         "until probes calibrate them")
    return notes
