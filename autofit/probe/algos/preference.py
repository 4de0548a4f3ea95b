"""``--algo dpo`` and ``--algo kto``: TRL's preference trainers on worst-case synthetic preference data.

Every row is exactly ``max_length`` tokens, the prompt half of it and each completion the other half: DPO's chosen and
rejected sides (concatenated into one forward of twice the micro-batch, as TRL does), KTO's completion, desirable and
undesirable rows in turn, and the mismatched KL completion TRL's collator makes of the next row's. The reference
model is TRL's own: reloaded from the policy's path, the policy with its adapter off under LoRA, or none where its
log-probabilities are precomputed (``precompute_ref_log_probs``, which a precompute pass over the probe's rows runs
before the first step, as it does over a user's dataset).
"""

from __future__ import annotations

from typing import Dict, List

from autofit.core import Candidate
from autofit.probe import kit as probe_kit


def _text(row: List[int]) -> str:
    """A row of token ids as text the synthesized tokenizer reads back to exactly those tokens (token ``t{i}`` is id
    i; words split on spaces), ending in a space: TRL appends the EOS token's text to a completion and joins a prompt
    and its completion without a separator."""
    return "".join(f"t{token} " for token in row)


def _halves(candidate: Candidate) -> Dict[str, List[str]]:
    """Prompts of half of ``max_length`` and two completions per prompt of the rest, less the EOS TRL appends: every
    prompt + completion is ``max_length`` tokens (TRL 1.16 tokenizes preference data from its text)."""
    rows = probe_kit.probe_rows(candidate)
    prompt = max(candidate.max_length // 2, 1)
    answer = max(candidate.max_length - prompt - 1, 1)
    prompts = probe_kit.synthetic_token_rows(candidate, prompt, rows)
    completions = probe_kit.synthetic_token_rows(candidate, answer, 2 * rows)
    return {"prompt": [_text(row) for row in prompts], "first": [_text(row) for row in completions[:rows]],
            "second": [_text(row) for row in completions[rows:]]}


def build_dpo_trainer(candidate: Candidate):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    halves = _halves(candidate)
    return DPOTrainer(
        model=probe_kit.model_path(candidate),
        args=DPOConfig(**candidate.training_args()),
        train_dataset=Dataset.from_dict({"prompt": halves["prompt"], "chosen": halves["first"],
                                         "rejected": halves["second"]}),
        processing_class=probe_kit.load_tokenizer(candidate),
        peft_config=candidate.peft_config(),
        quantization_config=candidate.quantization_config(),
    )


def build_kto_trainer(candidate: Candidate):
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    halves = _halves(candidate)
    labels = [index % 2 == 0 for index in range(len(halves["prompt"]))]  # desirable and undesirable in turn
    return KTOTrainer(
        model=probe_kit.model_path(candidate),
        args=KTOConfig(**candidate.training_args()),
        train_dataset=Dataset.from_dict({"prompt": halves["prompt"], "completion": halves["first"], "label": labels}),
        processing_class=probe_kit.load_tokenizer(candidate),
        peft_config=candidate.peft_config(),
        quantization_config=candidate.quantization_config(),
    )
