"""Weights in bfloat16: TRL loads them in float32 unless told (``model_init_kwargs={"dtype": ...}``, ``--dtype``).

Loaded in bf16, weights, gradients and AdamW's states are all bf16 ("pure bf16" training): 8 bytes per trained
parameter instead of 16 plus the autocast copy. It changes the numerics (no float32 master weights: small updates
can round away), so it is a quality rung, the mildest: most TRL recipes train this way."""

from autofit.core import user_dtype
from autofit.rungs._contract import RungBase
from autofit.rungs._ladder import QUALITY, LadderState

BF16 = "bfloat16"


def user_decided_dtype(candidate) -> bool:
    return user_dtype(candidate.user_args) is not None


class Bf16Weights(RungBase):
    name = "bf16-weights"
    cost = QUALITY
    modelled = True
    help = f"model_init_kwargs dtype={BF16} (TRL loads float32 otherwise): pure bf16 weights, gradients, AdamW states"
    trade_text = ("pure bf16 training: weights, gradients and optimizer states in bfloat16, no float32 master "
                  "weights (small updates can round away)")
    knobs = ("dtype",)
    knob_comment = ("bf16-weights: pure bf16 training, weights, gradients and optimizer states in bfloat16 (no "
                    "float32 master weights)")

    def apply(self, state: LadderState):
        candidate = state.candidate
        if candidate.dtype is not None or candidate.quantization is not None or user_decided_dtype(candidate):
            return None  # decided already (--dtype, the user's model_init_kwargs), or a quantized base
        if not candidate.unit.model_init_kwargs:
            return None  # PPOConfig has no model_init_kwargs: a PPO script loads its four models itself
        return state.with_rung(self, candidate_changes={"dtype": BF16})
