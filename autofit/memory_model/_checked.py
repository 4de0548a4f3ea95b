"""Which model families the ledger has been checked on, and how wide the band is for the others.

A family is checked for an algorithm when its tiny configuration, probed on the CPU meter, agrees with the
uncalibrated prediction within 5 % (``tests/memory_model/test_families.py`` measures every entry here;
docs/benchmarks.md has the table, ``make bench-families`` rebuilds it). Anything else gets a wider band and a note,
and the search's probes calibrate it: no confident wrong number.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Mapping, Optional

from autofit.core import algorithm, algorithm_names
from autofit.memory_model._census import ANALYTIC
from autofit.memory_model._key_table import PROBED_KEY, SAME_AS_DEFAULT, classify_key, means_the_default

if TYPE_CHECKING:
    from autofit.core import Candidate
    from autofit.memory_model._shape import ModelShape

# Training arguments the ledger does not describe: a prediction for a run with one of them gets the unchecked band,
# and the search and the estimate say so (the probes measure them).
UNMODELLED_ARGS = {"fp16": "fp16 mixed precision", "torch_compile": "torch.compile",
                   "padding_free": "padding-free batches (the probes pad every row to full length: a bound)"}

CHECKED_UNCERTAINTY = 0.25  # the prior's band for a checked family (the activation coefficients' spread, 2.4)
UNCHECKED_UNCERTAINTY = 0.5

_ALL = tuple(name for name in algorithm_names() if algorithm(name).checked_name == name)
_LM = tuple(name for name in _ALL if not algorithm(name).sequence_classifier)
CHECKED = {
    "llama": _ALL, "mistral": _ALL, "qwen2": _ALL, "qwen3": _ALL, "gemma": _ALL, "gemma2": _ALL, "gemma3_text": _ALL,
    "olmo2": _ALL, "glm4": _ALL, "mixtral": _ALL, "qwen2_moe": _ALL, "qwen3_moe": _ALL, "phi3": _ALL,
    "starcoder2": _ALL,
    # no sequence-classification class in transformers: no reward model to check
    "olmoe": _LM, "granite": _LM, "cohere": _LM,
}
# Dense families whose parameters the configuration's sizes give exactly (``_shape.analytic_census``, a test
# compares it with the model): no census needs building for them. The others need the census counted from the model
# (mixture-of-experts: peft's LoRA on the fused experts is only known from peft itself).
ANALYTIC_EXACT = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma3_text")


def sizes_are_exact(shape: ModelShape) -> bool:
    return shape.model_type in ANALYTIC_EXACT and not (shape.moe_layers or shape.eager_attention or shape.nested)


def unchecked_reason(shape: ModelShape, algo: str) -> Optional[str]:
    """Why the prediction for this model and algorithm is not a checked one, or None."""
    family = "gemma3_text" if shape.model_type == "gemma3" else shape.model_type
    algo = algorithm(algo).checked_name
    census = shape.parameters()
    if census.source == ANALYTIC and not sizes_are_exact(shape):
        return f"the parameters of {family} were not counted from the model (computed from its configuration)"
    if algo not in CHECKED.get(family, ()):
        return f"the activation terms of {family} are not checked against measurements for {algo}"
    return None


def unmodelled(candidate: Candidate) -> List[str]:
    """What the candidate sets that the ledger does not describe, in words."""
    from autofit.memory_model._parameters import optimizer_known

    args = dict(candidate.user_args)
    found = unmodelled_args(args)
    if args.get("deepspeed") and candidate.named_engine:  # a rung's engine drops it (the ladder)
        found.append(f"a DeepSpeed config of your own beside another engine of your launch's "
                     f"({candidate.named_engine})")
    if not optimizer_known(candidate.optim):
        found.append(f"the optimizer {candidate.optim} (two fp32 states assumed)")
    return found


def unmodelled_args(args: Mapping[str, Any]) -> List[str]:
    """The training arguments in ``args`` that the ledger does not describe, in words."""
    from autofit.memory_model._engine_settings import unmodelled_deepspeed

    found = [what for key, what in UNMODELLED_ARGS.items() if args.get(key) not in (None, False, "", [], {})]
    for key, value in args.items():  # what the key table says the probes run as written and the ledger leaves out
        kind = classify_key(key)
        if kind is None or kind[0] != PROBED_KEY or key in UNMODELLED_ARGS or value in (None, "", [], {}):
            continue
        if (value is False and key not in SAME_AS_DEFAULT) or means_the_default(key, value, None):
            continue  # off, as TRL's defaults mostly are (bf16's default is on)
        found.append(f"{kind[1]} ({key})")
    deepspeed = unmodelled_deepspeed(args.get("deepspeed"))
    return found + ([deepspeed] if deepspeed else [])


def prior_uncertainty(shape: ModelShape, algo: str) -> float:
    return CHECKED_UNCERTAINTY if unchecked_reason(shape, algo) is None else UNCHECKED_UNCERTAINTY
