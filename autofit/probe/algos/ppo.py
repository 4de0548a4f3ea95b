"""``--algo ppo``: TRL's PPOTrainer (TRL 0.29-1.12, ``trl.experimental.ppo``; removed in TRL 1.13).

Four models from the same configuration, as PPO trains them: the policy, a frozen reference (none under LoRA: the
adapter is disabled instead), a frozen reward model and a trained value model (sequence-classification heads).
Prompts are synthetic and ``prompt_length`` tokens long; with no stop token PPO generates exactly
``response_length`` tokens, the worst case. PPO's own loop never enables checkpointing from its config, so the
probe enables it on the policy and the value model when the candidate asks for it (a training script must too).
"""

from __future__ import annotations

from autofit.core import Candidate
from autofit.probe import kit as probe_kit


def _load(candidate: Candidate, auto_class, **kwargs):
    quantization = candidate.quantization_config()
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    return auto_class.from_pretrained(probe_kit.model_path(candidate), **kwargs, **_attention(candidate))


def _attention(candidate: Candidate) -> dict:
    """ModelConfig's attn_implementation as TRL's scripts pass it (the other trainers get it in model_init_kwargs)."""
    return {"attn_implementation": candidate.attn_implementation} if candidate.attn_implementation else {}


def build_trainer(candidate: Candidate):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    policy = _load(candidate, AutoModelForCausalLM)
    ref_policy = None if candidate.lora is not None else _load(candidate, AutoModelForCausalLM)
    reward_model = _load(candidate, AutoModelForSequenceClassification, num_labels=1)
    value_model = AutoModelForSequenceClassification.from_pretrained(probe_kit.model_path(candidate), num_labels=1,
                                                                     **_attention(candidate))
    if candidate.checkpointing:
        for model in (policy, value_model):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    prompts = probe_kit.synthetic_token_rows(candidate, candidate.prompt_length or 64, probe_kit.probe_rows(candidate))
    return PPOTrainer(
        args=PPOConfig(**candidate.training_args()),
        processing_class=probe_kit.load_tokenizer(candidate, padding_side="left"),
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=Dataset.from_dict({"input_ids": prompts}),
        peft_config=candidate.peft_config(),
    )
