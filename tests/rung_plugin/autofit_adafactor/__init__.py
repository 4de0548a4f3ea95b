"""autofit-adafactor: Hugging Face's Adafactor (``optim="adafactor"``) as a rung of autofit's ladder.

A package of its own, installed beside autofit, that touches no file of autofit: its ``pyproject.toml`` declares

    [project.entry-points."autofit.rungs"]
    adafactor = "autofit_adafactor:Adafactor"

(here, ``autofit_adafactor-1.0.dist-info/entry_points.txt``: put this folder on ``sys.path`` and it is installed), and
``autofit search --ladder micro-batch,adafactor`` climbs it. docs/ladder.md ("Write a rung") walks through it.

Adafactor keeps no first moment (transformers' Trainer builds it with ``beta1=None``) and factors the second moment
of each matrix into a row and a column: for a [r, c] weight, r + c numbers instead of AdamW's 2 x r x c. The
optimizer states all but vanish; the updates are not AdamW's, so it is a quality rung. This module is imported in the
search's process (no torch here); the probe step, in ``autofit_adafactor.probe``, in the probe's.
"""

from __future__ import annotations

from math import prod
from typing import Any, Dict, Mapping, Optional

from autofit.rungs import QUALITY, Candidate, LadderState, ModelFacts, RungBase

OPTIM = "adafactor"


class Adafactor(RungBase):
    name = "adafactor"
    cost = QUALITY
    help = "Adafactor instead of AdamW (optim=adafactor): no first moment, a factored second moment"
    key_comments = {"optim": "adafactor: a row and a column of second moments per matrix instead of AdamW's two "
                             "full states"}
    probe_step = "autofit_adafactor.probe:AdafactorStep"

    def apply(self, state: LadderState) -> Optional[LadderState]:
        candidate = state.candidate
        if candidate.optim is not None or "optim" in dict(candidate.user_args):
            return None  # the user's optimizer, or an earlier rung's (8-bit states), is kept
        if candidate.lora is not None or candidate.sharding:
            return None  # adapters' states are small already; sharded states are the engine's
        return state.with_rung(self, candidate_changes={"optim": OPTIM})

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        return ("Adafactor replaces AdamW: no momentum and a factored second moment, so the optimizer states all "
                "but vanish; its updates are not AdamW's: check the loss curve and the learning rate")

    def ledger(self, terms: Dict[str, int], candidate: Candidate, model: ModelFacts) -> Dict[str, int]:
        """The memory model's optimizer table prices Adafactor at Hugging Face's rule of thumb (4 B per parameter);
        the factored states are far smaller: each phase's optimizer term gets the exact figure instead."""
        table = model.optimizer_state_bytes(OPTIM, 4)
        if terms.get("optimizer", 0) < table:
            return terms  # a phase without the optimizer's states
        return {**terms, "optimizer": int(terms["optimizer"] - table + factored_state_bytes(model, candidate))}


def factored_state_bytes(model: ModelFacts, candidate: Candidate) -> int:
    """Adafactor's states for full fine-tuning (transformers' ``Adafactor``, ``beta1=None``): per tensor of two or
    more dimensions a row and a column, per vector a full second moment, in the gradients' dtype."""
    per = 2 if candidate.dtype in ("bfloat16", "float16") else 4
    numbers = 0
    for dims, count in model.parameter_shapes:
        numbers += count * (prod(dims[:-1]) + prod(dims[:-2] + dims[-1:]) if len(dims) >= 2 else prod(dims))
    return numbers * per
