"""A knob, declared once: what a rung turns and every stage reads, with the TRL keys that spell it.

A ``Knob`` names its ``Candidate`` fields and the keys it owns (the TRL config class's, ModelConfig's), and carries,
each part optional:

- how the candidate writes them: ``training`` (the config class's keyword arguments, as a probe and a factory get
  them), ``model`` (ModelConfig's, as best.yaml writes them), ``block`` (best.json's structured block in the library's
  own names: peft's ``LoraConfig``, transformers' ``BitsAndBytesConfig``);
- how they are read back: ``options`` and ``baseline`` (a TRL file as TRL parsed it: the search's options it sets, the
  run the ladder starts from), ``observe`` and ``trained`` (a built trainer, in the probe's child: what it runs, and
  that read back into the fields);
- its words: the key table's row for each key, and best.yaml's comment where no rung claims the key (``said``).

The table is ``autofit.core._knob_table``; ``autofit.core._knobs`` derives what every stage reads from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

from autofit.core._candidate_fields import CandidateFields

MODELLED = "modelled"
PROBED = "probed"


class FileRun(NamedTuple):
    """A TRL config file as TRL parsed it: its config class's fields, ModelConfig's, and the keys the file writes."""

    training: Mapping[str, Any]
    model: Mapping[str, Any]
    written: Mapping[str, Any]
    algo: str = ""


def _nothing(*_: Any) -> Dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Knob:
    name: str
    fields: Tuple[str, ...] = ()  # the Candidate fields it sets
    training_keys: Mapping[str, str] = field(default_factory=dict)  # the TRL config's keys -> the key table's words
    model_keys: Mapping[str, str] = field(default_factory=dict)  # ModelConfig's keys -> the key table's words
    kind: str = MODELLED  # its keys' kind in the key table
    searched: bool = False  # autofit sets it on every candidate: a user's own value is replaced (said)
    # the file's keys its readers consume: the search sets them, they are not passed through to the probes again
    reads: Tuple[str, ...] = ()
    # the file's key behind each option it reads (for messages that name the user's own key)
    option_keys: Mapping[str, str] = field(default_factory=dict)
    late: Tuple[str, ...] = ()  # fields added after studies were stored: left out of the study key at their default
    training: Callable[[CandidateFields], Dict[str, Any]] = _nothing
    model: Callable[[CandidateFields, Mapping[str, Any]], Dict[str, Any]] = _nothing  # (candidate, observed)
    block: Optional[Tuple[str, Callable[[CandidateFields], Optional[Dict[str, Any]]]]] = None
    options: Optional[Callable[[FileRun], Dict[str, Any]]] = None
    baseline: Optional[Callable[[FileRun], Dict[str, Any]]] = None
    for_device: Optional[Callable[[Any, str], Any]] = None  # the baseline's value as a probe on that device runs it
    observe: Optional[Callable[[Any], Dict[str, Any]]] = None  # a built trainer -> observed entries (plain data)
    trained: Optional[Callable[[CandidateFields, Mapping[str, Any]], Dict[str, Any]]] = None
    # best.yaml's comment on one of its keys: before the rungs have theirs (a flag's), or after (what no rung set)
    said_before: Optional[Callable[[str, CandidateFields, Mapping[str, Any]], Optional[str]]] = None
    said_after: Optional[Callable[[str, CandidateFields], Optional[str]]] = None

    @property
    def keys(self) -> Tuple[str, ...]:
        return tuple(self.training_keys) + tuple(self.model_keys)

    def owns(self, key: str) -> bool:
        return key in self.training_keys or key in self.model_keys


def merged(args: Dict[str, Any], more: Mapping[str, Any]) -> Dict[str, Any]:
    """``args`` with ``more`` set; a mapping set over a mapping is merged (two knobs' ``model_init_kwargs``, the
    user's ``liger_kernel_config`` under Liger's)."""
    for key, value in more.items():
        before = args.get(key)
        args[key] = {**before, **value} if isinstance(before, dict) and isinstance(value, dict) else value
    return args
