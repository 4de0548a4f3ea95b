"""Why the chosen configuration won, in the search's own rule (docs/ladder.md, "How the search climbs it"): the
cheapest cost class with a fit; in the free and speed classes the fastest fit by its probe's timing (a tie within
the machine's noise decided by the throughput model where it can split them, else by verifying both), in the quality
class the first rung that fits; with ``--maximize length`` the longest length first. Not one timing: the
verification runs after the choice, except for a tie that verifying both settled."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from autofit.rungs import COSTS, FREE, QUALITY, rung_named

log = logging.getLogger(__name__)

CLASS_WORDS = {"free": "free (the same training, as fast or faster)",
               "speed": "speed (the same training, maybe slower: smaller micro-batches, recomputed activations, "
                        "sharding, offloading)",
               "quality": "quality (a different training: LoRA, quantization, 8-bit states, shorter sequences)"}
TIE_NOTE = "speed within the noise"  # how the search's note of a tie decided by the throughput model begins
VERIFIED_TIE_NOTE = "two fits within the noise"  # ... and of a tie it could not split, settled by verifying both


@dataclass
class Run:
    """One timed run of a configuration that fitted: its probe, or its verification."""
    label: str
    rungs: Tuple[str, ...]
    kind: str
    peak: float
    speed: float


def cost_class(rungs: Sequence[str]) -> Optional[str]:
    """The costliest class among ``rungs`` (free without any); None when a rung is not known here (a plug-in that
    is not installed)."""
    costs = [FREE]
    for name in rungs:
        try:
            rung = rung_named(name)
        except Exception as exc:  # noqa: BLE001 - a plug-in's own failure: the page says the rule without the class
            log.debug("rung %s: %s", name, exc)
            rung = None
        if rung is None or getattr(rung, "cost", None) not in COSTS:
            return None
        costs.append(rung.cost)
    return max(costs, key=COSTS.index)


def _speeds(runs: Sequence[Run], label: str, kind: str) -> List[float]:
    return [run.speed for run in runs if run.label == label and run.kind == kind]


def why(best: Dict, runs: Sequence[Run], chosen: str) -> str:
    """One paragraph of plain text: the rule that chose ``chosen`` among ``runs``, with the timings it compared."""
    rungs = tuple(best.get("rungs") or ())
    maximize = (best.get("search") or {}).get("maximize")
    notes = [note for note in best.get("notes") or [] if isinstance(note, str)]
    probed, verified = _speeds(runs, chosen, "probe"), _speeds(runs, chosen, "verify")
    after = ""
    verified_tie = next((note for note in notes if note.startswith(VERIFIED_TIE_NOTE)), None)
    if verified_tie and verified and maximize != "length":
        after = f" Here a tie the throughput model could not split, settled by the verification: {verified_tie}."
    elif probed and verified:
        after = (f" Its verification ({verified[-1]:,.0f} tokens/s over more steps) ran after the choice and checked "
                 f"that it fits; its probe's {probed[-1]:,.0f} tokens/s is the timing that was compared.")
    if maximize == "length":
        return ("Why this one: with --maximize length the longest sequence that fits wins, then the fastest "
                "measured at that length." + after)
    klass = cost_class(rungs)
    if klass is None:
        return ("Why this one: the cheapest cost class with a fit wins, and in it the fastest measured fit (the "
                "first that fits among rungs that change the training)." + after)
    text = f"Why this one: the cheapest cost class with a fit is {CLASS_WORDS[klass]}"
    if klass == QUALITY:
        return (text + "; in it the first rung that fits wins, not the fastest, because each later rung changes "
                "the training more." + after)
    rivals = sorted({run.label for run in runs if run.kind == "probe" and cost_class(run.rungs) == klass})
    timed = "; ".join(f"{label} {max(_speeds(runs, label, 'probe')):,.0f}" for label in rivals
                      if _speeds(runs, label, "probe"))
    text += ("; in it the fastest fit by its probe's timing wins, and two timings within the machine's noise are a "
             "tie that the throughput model's prediction decides where it predicts them further apart than its band; "
             "where it cannot, both are verified and the faster verification wins.")
    if len(rivals) > 1:
        text += f" Compared (tokens/s): {timed}."
    tie = next((note for note in notes if note.startswith(TIE_NOTE)), None)
    if tie:
        text += f" Here a tie: {tie}."
    return text + after
