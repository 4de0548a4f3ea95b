"""``--use-vllm colocate|server`` in a search (GRPO, RLOO): vLLM probed where it is installed, estimated where not.

With vLLM installed, probes run TRL's own vLLM path (``use_vllm=True`` and its mode): the probe measures the whole
process, vLLM's share of the card included. Without it, the probes cannot run it, so they measure what the trainer
itself needs and leave vLLM's part to vLLM's own accounting (``memory_model.vllm``), and the notes say so:

- the trainer's budget is the card less vLLM's colocated share (``vllm_gpu_memory_utilization``); in server mode
  vLLM runs on other GPUs and the trainer has the whole card;
- the probes generate with transformers, as TRL does without vLLM, but that phase is vLLM's work: it is measured,
  never held against the budget (``exempt_phases``), and on CUDA the cache it leaves is emptied before training
  goes on.

The exported configuration sets ``use_vllm`` and its mode either way: that is what the user runs.
"""

from __future__ import annotations

import logging
from typing import List, Tuple

log = logging.getLogger(__name__)

def reserve_share(spec) -> List[str]:
    """Before a search with vLLM estimated: the trainer's budget is what vLLM leaves of the card; notes that say what
    was estimated (the spec's budget is changed in place)."""
    from autofit.core import vllm_installed

    if spec.vllm is None or vllm_installed():
        return []
    from autofit.memory_model import trainer_budget, vllm_lines
    from autofit.memory_model import shape_or_none

    shape = shape_or_none(spec.model)
    estimated = [line.removeprefix("vllm: ") for line in vllm_lines(spec, shape)[:1]] if shape is not None else []
    card = spec.budget_bytes
    spec.budget_bytes = trainer_budget(spec)
    from autofit.core import format_size

    note = (f"vLLM is not installed here, so its part is estimated only: the probes measured the trainer within "
            f"{format_size(spec.budget_bytes)} of {format_size(card)} and generated with transformers, a phase "
            "measured but not held against the budget")
    notes = [note] + [f"vLLM {line}" for line in estimated]
    for line in notes:
        log.warning("%s", line)
    return notes
