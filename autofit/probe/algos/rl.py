"""``--algo grpo`` and ``--algo rloo``: TRL's online RL trainers, probed through a whole generate-and-update cycle.

Prompts are synthetic and exactly ``prompt_length`` tokens long; completions are forced to the full
``max_completion_length`` (``min_new_tokens`` during probes), so the KV cache, the log-prob passes and the loss see
the worst case. The reward is a rule (no reward model), so it costs no device memory. With ``beta > 0`` TRL loads
the reference model from the policy's path (the weightless checkpoint), and it is measured like the rest.
"""

from __future__ import annotations

from typing import List

from autofit.core import Candidate
from autofit.probe import kit as probe_kit


def length_reward(completions, **kwargs) -> List[float]:
    """A rule-based reward: probes need a reward signal, not a meaningful one."""
    return [float(len(completion)) for completion in completions]


def _prompts(candidate: Candidate) -> List[str]:
    length = candidate.prompt_length or 64
    rows = probe_kit.synthetic_token_rows(candidate, length, probe_kit.probe_rows(candidate))
    return [" ".join(f"t{token}" for token in row) for row in rows]


def _build(candidate: Candidate, trainer_class, config_class):
    from datasets import Dataset

    return trainer_class(
        model=probe_kit.model_path(candidate),
        reward_funcs=length_reward,
        args=config_class(**candidate.training_args()),
        train_dataset=Dataset.from_dict({"prompt": _prompts(candidate)}),
        processing_class=probe_kit.load_tokenizer(candidate, padding_side="left"),
        peft_config=candidate.peft_config(),
        quantization_config=candidate.quantization_config(),
    )


def build_grpo_trainer(candidate: Candidate):
    from trl import GRPOConfig, GRPOTrainer

    return _build(candidate, GRPOTrainer, GRPOConfig)


def build_rloo_trainer(candidate: Candidate):
    from trl import RLOOConfig, RLOOTrainer

    return _build(candidate, RLOOTrainer, RLOOConfig)
