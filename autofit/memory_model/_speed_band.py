"""How wide the speed prediction's band is before the search has timed a step, and what it does not price (issue
48): a compiled step, priced as eager PyTorch runs it, an unpacked SFT batch, priced as full-length rows, and
activation offloading's copies, priced where they outrun the compute they overlap."""

from __future__ import annotations

from typing import List, Tuple

from autofit.core import Candidate
from autofit.memory_model._activation_policy import activation_policy

PRIOR_SPEED_UNCERTAINTY = 0.40  # the band before the search has timed a step [A]
# ``torch_compile`` fuses a step's elementwise passes and cuts its launches: the decoder layers' are priced as
# inductor compiles them (``_traffic.COMPILED``, ``_dispatch.KERNELS_COMPILED_*``); what else it does (graph breaks
# at peft's adapters or TRL's head, autotuned matmuls, the compile itself) widens the band [M: PyTorch 2.0's release
# notes, training on an A100 across 163 open-source models: 21% faster in float32, 51% under AMP; about a quarter for
# a fine-tune's step]
COMPILE_BAND = 0.25
# Rows priced at their full length where SFT pads each batch to its longest row: a bound, with the memory model's
# wide band (``_checked.UNCHECKED_UNCERTAINTY``)
UNPACKED_BAND = 0.50


def _set(value: object) -> bool:
    return value not in (None, False, "", "false", "False", 0)


def compiled(candidate: Candidate) -> bool:
    """Whether the user's file compiles the model (``torch_compile``)."""
    return _set(dict(candidate.user_args).get("torch_compile"))


def speed_band(candidate: Candidate) -> Tuple[float, Tuple[str, ...]]:
    """The prior's band for ``candidate`` and, in words, what widened it."""
    args = dict(candidate.user_args)
    band: float = PRIOR_SPEED_UNCERTAINTY
    notes: List[str] = []
    if _set(args.get("torch_compile")):
        band += COMPILE_BAND
        notes.append(f"torch_compile: the decoder layers are priced as inductor fuses them (fewer bytes and "
                     f"kernels), the rest of the step as eager; graph breaks and the compile itself are not priced "
                     f"(the band is widened by {COMPILE_BAND:.0%})")
    if candidate.algo == "sft" and not (_set(args.get("packing")) or _set(args.get("padding_free"))):
        band = max(band, UNPACKED_BAND)
        notes.append(f"packing is off: every row is priced at its full {candidate.max_length} tokens, a bound (your "
                     f"rows are shorter, and each batch pads to its longest; the band is ±{band:.0%})")
    if activation_policy(candidate).offloads_activations:
        notes.append("activation offloading: its copies run beside the compute on a second stream (TRL's); only what "
                     "outruns the compute is priced")
    return band, tuple(notes)
