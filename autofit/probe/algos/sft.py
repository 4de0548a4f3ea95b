"""``--algo sft``: TRL's SFTTrainer on worst-case synthetic data (every row exactly ``max_length`` tokens)."""

from __future__ import annotations

from autofit.core import Candidate
from autofit.probe import kit as probe_kit


def build_trainer(candidate: Candidate):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    path = probe_kit.model_path(candidate)
    rows = probe_kit.synthetic_token_rows(candidate, candidate.max_length, probe_kit.probe_rows(candidate))
    return SFTTrainer(
        model=path,
        args=SFTConfig(**candidate.training_args()),
        train_dataset=Dataset.from_dict({"input_ids": rows}),
        processing_class=probe_kit.load_tokenizer(candidate),
        peft_config=candidate.peft_config(),
        quantization_config=candidate.quantization_config(),
    )
