"""Smaller micro-batches with more gradient accumulation; the effective batch is kept exactly."""

from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import SPEED, LadderState


class MicroBatch(RungBase):
    name = "micro-batch"
    cost = SPEED
    modelled = True
    help = "per_device_train_batch_size x gradient_accumulation_steps = effective batch, micro-batch searched"
    trade_text = ("smaller micro-batches with more accumulation: the same effective batch, more steps of less "
                  "work")
    knobs = ("batch",)
    knob_comment = "micro-batch (effective batch kept)"
    priced_by_its_search = "the search then varies the micro-batch from the level's full batch down"

    def apply(self, state: LadderState):
        if state.vary_batch or state.candidate.micro_batch * state.candidate.grad_accum == 1:  # per rank
            return None
        return state.with_rung(self, vary_batch=True)
