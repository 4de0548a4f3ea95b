"""``--algo reward``: TRL's RewardTrainer (a sequence-classification head on the model) on preference pairs whose
chosen and rejected sides are both exactly ``max_length`` tokens: the worst case of long-context reward training."""

from __future__ import annotations

from autofit.core import Candidate
from autofit.probe import kit as probe_kit


def build_trainer(candidate: Candidate):
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    rows = probe_kit.probe_rows(candidate)
    chosen = probe_kit.synthetic_token_rows(candidate, candidate.max_length, rows)
    rejected = [list(reversed(row)) for row in chosen]
    return RewardTrainer(
        model=probe_kit.model_path(candidate),
        args=RewardConfig(**candidate.training_args()),
        train_dataset=Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": rejected}),
        processing_class=probe_kit.load_tokenizer(candidate),
        peft_config=candidate.peft_config(),
        quantization_config=candidate.quantization_config(),
    )
