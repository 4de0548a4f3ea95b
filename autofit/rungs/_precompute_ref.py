"""The reference model's log-probs precomputed (DPO, KTO: ``precompute_ref_log_probs``): TRL computes them once,
before training, with the policy as it starts (which is the reference: the initial model), and never holds a
reference model. The same math; the reference's forwards move from every step to one pass before the first."""

from typing import Optional

from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import FREE, LadderState


class PrecomputeReference(RungBase):
    name = "precompute-ref"
    cost = FREE
    modelled = True
    help = ("precompute_ref_log_probs=True (DPO, KTO): the reference's log-probs computed once before training, no "
            "reference model held")
    knobs = ("precompute_ref",)
    trade_text = ("the reference model's log-probs are computed once, before training, by the policy as it starts "
                  "(the reference is that initial model): no reference model is held, and training starts after a "
                  "pass over the data")

    def apply(self, state: LadderState) -> Optional[LadderState]:
        candidate = state.candidate
        args = dict(candidate.user_args)
        if not candidate.unit.precompute_ref or candidate.precompute_ref or candidate.lora is not None:
            return None  # under LoRA the reference is the policy with its adapter off: nothing to save
        if args.get("beta") == 0 or args.get("sync_ref_model"):  # no reference model, or one TRL keeps syncing
            return None
        return state.with_rung(self, candidate_changes={"precompute_ref": True})
