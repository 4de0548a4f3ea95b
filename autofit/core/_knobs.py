"""What more than one stage derives from the knob table (``autofit.core._knob_table``): the training arguments,
best.json's blocks, the candidate as its trainer built it, the keys autofit searches, and which fields of the
candidate's study key were added late. What the launch alone reads of a TRL file through the table is
``autofit.launch._file_knobs``'s, the key table's rows of the knobs' keys ``autofit.memory_model._key_table``'s."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from autofit.core._candidate_fields import CandidateFields, Fields
from autofit.core._knob import Knob, merged
from autofit.core._knob_table import KNOBS


def _table() -> Tuple[Knob, ...]:
    return KNOBS


def keys_of(*names: str) -> Tuple[str, ...]:
    """The keys the named knobs own, in the table's order."""
    return tuple(key for k in _table() if k.name in names for key in k.keys)


# -- written -------------------------------------------------------------------------------------------------------
def knob_training_args(candidate: CandidateFields) -> Dict[str, Any]:
    """The knobs' keyword arguments for the candidate's config class, in the table's order, over its user_args."""
    args: Dict[str, Any] = dict(candidate.user_args)
    for k in _table():
        merged(args, k.training(candidate))
    return args


def blocks(candidate: CandidateFields) -> Dict[str, Optional[Dict[str, Any]]]:
    """best.json's structured blocks (``peft``, ``quantization``) in their libraries' own names."""
    return {k.block[0]: k.block[1](candidate) for k in _table() if k.block is not None}


def model_keys() -> Tuple[str, ...]:
    return tuple(key for k in _table() for key in k.model_keys)


# -- read back -----------------------------------------------------------------------------------------------------
def on_device(field_name: str, value: Any, device: str) -> Any:
    """A baseline's value as the probes on ``device`` run it (the attention kernel this machine has)."""
    owner = next((k for k in _table() if field_name in k.fields), None)
    return owner.for_device(value, device) if owner is not None and owner.for_device is not None else value


def as_trained(candidate: Fields, observed: Optional[Mapping[str, Any]]) -> Fields:
    """The candidate with what the user's own trainer adds (read back in the probe): its LoRA, its quantized base,
    its number of generations. Predicted and exported as measured: a best.yaml without the user's LoRA would
    describe a full fine-tune that does not fit."""
    changes: Dict[str, Any] = {}
    for k in _table():
        if k.trained is not None and observed:
            changes.update(k.trained(candidate, observed))
    return candidate.replace(**changes) if changes else candidate


# -- identity and the key table ------------------------------------------------------------------------------------
def late_fields() -> Tuple[str, ...]:
    return tuple(name for k in _table() for name in k.late)


def searched_keys(length_fields: Iterable[str]) -> Tuple[str, ...]:
    """What autofit sets on every candidate (a user's ``training_args`` value for one is replaced, and said): the
    searched knobs' keys, and every algorithm's length field."""
    keys: List[str] = [key for k in _table() if k.searched for key in k.training_keys]
    return tuple(keys + [name for name in length_fields if name not in keys])
