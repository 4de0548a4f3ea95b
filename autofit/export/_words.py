"""The export's words: what the user trades for the fit (best.json ``trades``, the notes) and the comment best.yaml
gives each key. Both are the rungs' own (``RungBase.trade``, ``RungBase.comment``), found by the names the candidate
climbed; what is not a rung's (the effective batch, a flag of the user's, the device) is said here, by config key.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

from autofit.core import KNOBS, Candidate, Knob, algorithm, one_line
from autofit.memory_model import ModelShape, census_for, trainable_tensors
from autofit.rungs import ACCELERATE_YAML, rung_named


def knob_of_key(key: str) -> Optional[Knob]:
    """The knob that owns a TRL or ModelConfig key; None for a key no knob owns."""
    return next((k for k in KNOBS if k.owns(key)), None)

# Keys no knob owns whose value no rung decided
FIXED_REASONS = {
    "model_name_or_path": "random weights were probed; memory does not depend on their values",
    "use_cpu": "CPU device (simulated meter)",
    "bf16": "CPU device (simulated meter)",
}


def trades(candidate: Candidate, asked_length: int, shape: Optional[ModelShape] = None) -> List[str]:
    """The quality cost of each rung of ``candidate``, in the order they were climbed, in the rung's words.
    ``shape``: the model's ``ModelShape`` (LoRA's share of trained parameters), or None."""
    context = trade_context(candidate, asked_length, shape)
    sentences = []
    for name in candidate.rungs:
        trade = getattr(rung_named(name), "trade", None)  # None: a rung autofit does not know, or one without words
        sentence = trade(candidate, context) if trade is not None else None
        if sentence:
            sentences.append(sentence)
    return sentences


def trade_context(candidate: Candidate, asked_length: int, shape: Optional[ModelShape]) -> Dict[str, Any]:
    """What a rung's sentence may need that the candidate does not carry: the asked length, and with adapters and a
    known model, the parameters they train (the memory model counts them)."""
    context: Dict[str, Any] = {"asked_length": asked_length}
    if candidate.lora is not None and shape is not None:
        census = census_for(shape, candidate.algo)
        context.update(trained_parameters=sum(t.numel * t.count for t in trainable_tensors(shape, candidate)),
                       total_parameters=census.total,
                       adapts_fused_experts=bool(shape.moe_layers and census.lora_wrapped))
    return context


def why(key: str, candidate: Candidate, asked_length: int, maximize: str) -> str:
    """best.yaml's comment on one exported key (``env.NAME`` for an environment variable): the reason it is not a
    rung's, else the first of the candidate's rungs that claims it, else the user's own."""
    return (_before_rungs(key, candidate, asked_length, maximize) or _rungs(key, candidate)
            or _after_rungs(key, candidate) or "yours")


def was(key: str, value: Any, before: Mapping[str, Any], defaults: Mapping[str, Any]) -> Optional[str]:
    """What ``key`` was in the user's run (``before``: the keys the ladder's first level exports, ``env.NAME`` for its
    environment; ``defaults``: the config class's, for a key that level leaves at TRL's default), in best.yaml's words:
    ``was 8``, ``was adamw_torch_fused (TRL default)``, ``was unset``; None where the answer did not change it."""
    if key in before:
        return None if before[key] == value else f"was {shown(before[key])}"
    if key in defaults:
        return None if defaults[key] == value else f"was {shown(defaults[key])} (TRL default)"
    return "was unset"


def shown(value: Any) -> str:
    """A value as best.yaml's comment says it: as YAML writes it (``true``, ``{dtype: bfloat16}``), on one line."""
    if value is None:
        return "unset"
    if isinstance(value, str):
        return one_line(value)
    try:
        text = yaml.safe_dump(_listed(value), default_flow_style=True, width=float("inf"))
    except yaml.YAMLError:  # a type YAML has no word for: as Python says it
        return one_line(str(value))
    return one_line(text.strip().removesuffix("...").strip())


def _listed(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [_listed(v) for v in value]
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    return value


def _before_rungs(key: str, candidate: Candidate, asked_length: int, maximize: str) -> Optional[str]:
    """Keys whose value no rung decided: the user's flags, the device, the length as asked (the knob's words)."""
    owner = knob_of_key(key)
    if owner is not None and owner.said_before is not None:
        said = owner.said_before(key, candidate, {"asked_length": asked_length, "maximize": maximize})
        if said:
            return said
    return FIXED_REASONS.get(key)


def _rungs(key: str, candidate: Candidate) -> Optional[str]:
    for name in candidate.rungs:
        comment = getattr(rung_named(name), "comment", None)
        text = comment(key, candidate) if comment is not None else None
        if text:
            return text
    return None


def _after_rungs(key: str, candidate: Candidate) -> Optional[str]:
    """Keys no rung of the candidate claims that are not the user's either: the knob's words (the effective batch,
    checkpointing left off, the trainer's own LoRA or quantization, --dtype)."""
    owner = knob_of_key(key)
    return owner.said_after(key, candidate) if owner is not None and owner.said_after is not None else None


def usage(algo: str, offload: Optional[str] = None, written: Tuple[str, ...] = ()) -> str:
    """How the answer runs; ``written``: the keys of the user's own file, which may name the data and rewards."""
    unit = algorithm(algo)
    command = train_command(algo, offload, written)
    if command is None:
        return unit.usage or f"# build {unit.config_class.rsplit(':', 1)[-1] or 'your config'}(**best.json['config'])"
    return f"# use: {command}"


def train_command(algo: str, offload: Optional[str] = None, written: Tuple[str, ...] = (),
                  best_yaml: str = "best.yaml", accelerate_yaml: str = ACCELERATE_YAML) -> Optional[str]:
    """The command that trains the answer (``trl <command> --config best.yaml ...``, what it needs that the file does
    not name as ``YOUR_...`` placeholders); None for an algorithm TRL has no command for (PPO)."""
    unit = algorithm(algo)
    if unit.trl_command is None:
        return None
    engine = f" --accelerate_config {accelerate_yaml}" if offload else ""
    data = "" if {"dataset_name", "datasets"} & set(written) else " --dataset_name YOUR_DATASET"
    rewards = ""  # TRL's grpo and rloo commands need a reward: a function of the registry or a module's, or a model
    if unit.groups and not {"reward_funcs", "reward_model_name_or_path"} & set(written):
        rewards = " --reward_funcs YOUR_REWARD"
    return f"trl {unit.trl_command} --config {best_yaml}{engine}{data}{rewards}"
