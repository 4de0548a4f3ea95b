"""What a built trainer actually runs, read back from it in the probe: its arguments, its LoRA, its quantization and
the longest row of its dataset. A user's factory may set its own ``LoraConfig``, ``num_generations`` or prompts:
the export writes what was measured and the memory model predicts from it, not from the candidate's defaults. Read
beside it: whether the trainer is one built with the candidate's settings, its config class's defaults, and the
tokens one optimizer step trains on."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, Iterable, Optional

from autofit.core import KNOBS, Candidate, FactoryMisuse, keys_of

log = logging.getLogger(__name__)

ARG_KEYS = ("num_generations", "max_completion_length", "max_length", "steps_per_generation", "generation_batch_size",
            "beta", "optim")
ROWS_CHECKED = 10_000  # the longest row is looked for in this many rows (a dataset's first ones)
ID_COLUMNS = ("input_ids", "chosen_ids", "rejected_ids", "chosen_input_ids", "rejected_input_ids")


def plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def longest_row(dataset, tokenizer=None) -> Optional[int]:
    """Tokens in the longest row of the first ``ROWS_CHECKED`` rows: token-id columns, else prompts tokenized."""
    if dataset is None or not hasattr(dataset, "column_names"):
        return None
    rows = dataset.select(range(min(len(dataset), ROWS_CHECKED)))
    lengths = [len(ids) for column in ID_COLUMNS if column in rows.column_names for ids in rows[column]]
    if not lengths and "prompt" in rows.column_names and tokenizer is not None:
        prompts = [p if isinstance(p, str) else str(p) for p in rows["prompt"]]
        lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    return max(lengths) if lengths else None


def observe_trainer(trainer: Any) -> Dict[str, Any]:
    """What a built trainer runs, as the knobs read it (in the probe's child; plain data for JSON)."""
    seen: Dict[str, Any] = {}
    for k in KNOBS:
        if k.observe is not None:
            seen.update(k.observe(trainer))
    return seen


def describe_trainer(trainer, candidate: Optional[Candidate] = None) -> Dict[str, Any]:
    """Plain data (it goes to JSON) about what ``trainer`` runs: with ``candidate``, also the environment variables
    it asked for as this process sees them (the user's ``env:`` block and the rungs')."""
    args = trainer.args
    seen: Dict[str, Any] = {"args": {key: plain(getattr(args, key)) for key in ARG_KEYS if hasattr(args, key)}}
    seen["args"]["checkpointing"] = any(bool(getattr(args, key, None)) for key in keys_of("checkpointing"))
    seen.update(observe_trainer(trainer))  # the knobs' (their LoRA, their quantized base)
    base = getattr(trainer.model, "get_base_model", lambda: trainer.model)()
    attention = getattr(getattr(base, "config", None), "_attn_implementation", None)
    seen["attn_implementation"] = attention if isinstance(attention, str) else None
    seen["trainable_parameters"] = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    if candidate is not None and candidate.env:
        seen["env"] = {key: os.environ.get(key) for key, _ in candidate.env}
    try:
        seen["longest_row"] = longest_row(getattr(trainer, "train_dataset", None),
                                          getattr(trainer, "processing_class", None))
    except Exception as exc:  # noqa: BLE001 - an unusual dataset: say nothing rather than fail the probe
        log.debug("longest row not found: %s", exc)
        seen["longest_row"] = None
    return seen


def check_trainer(trainer, candidate: Candidate) -> None:
    """A factory must return a Trainer built with the candidate's settings, or the probe measures something else."""
    from transformers import Trainer

    if not isinstance(trainer, Trainer):
        raise FactoryMisuse(
            f"the trainer factory returned {type(trainer).__module__}.{type(trainer).__qualname__}, not a "
            "transformers/TRL Trainer: return the trainer it builds (e.g. SFTTrainer(...))"
        )
    args = trainer.args
    expected = candidate.training_args()
    wrong = {
        key: (getattr(args, key, None), value)
        for key, value in expected.items()
        if key in (*keys_of("batch"), "max_steps")
        and getattr(args, key, None) != value
    }
    if wrong:
        raise FactoryMisuse(
            "the trainer factory ignored the candidate's settings "
            + ", ".join(f"{k}={got!r} (expected {want!r})" for k, (got, want) in wrong.items())
            + ": build the config with candidate.training_args()"
        )


def config_defaults(config_class, keys: Iterable[str]) -> Dict:
    """The config class's own defaults for ``keys``, so the export writes only what differs from them."""
    defaults = {}
    for item in dataclasses.fields(config_class):
        if item.name not in keys:
            continue
        if item.default is not dataclasses.MISSING:
            value = item.default
        elif item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
        else:
            continue
        defaults[item.name] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
    return defaults


def tokens_per_step(candidate: Candidate, observed: Dict) -> int:
    """Tokens one optimizer step trains on, from what the trainer runs: RL rows are the prompt (the dataset's
    longest, else the candidate's) plus the completion; other rows are at most the dataset's longest row."""
    longest = observed.get("longest_row")
    rows = candidate.micro_batch * candidate.probe_accumulation * candidate.ranks  # the ranks step together
    if candidate.is_rl:
        completion = observed.get("args", {}).get("max_completion_length")
        completion = completion if isinstance(completion, int) else candidate.max_length
        return rows * ((longest or candidate.prompt_length or 0) + completion)
    return rows * min(longest or candidate.max_length, candidate.max_length)
