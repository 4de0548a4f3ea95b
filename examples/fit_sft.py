"""autofit.fit() with your own trainer code: the factory builds a TRL SFTTrainer from each candidate.

    python examples/fit_sft.py            # CPU: a simulated 300 MiB device, the bundled tiny model
    python examples/fit_sft.py --gpu      # a CUDA machine: Qwen/Qwen2.5-0.5B within 12 GiB

The factory runs in fresh probe processes; it reaches them by value, so any function works (this one is at module
level only for reading's sake). Build the config from ``candidate.training_args()`` and pass the candidate's peft
and quantization configs; autofit keeps your own arguments (here learning rate and scheduler) as they are.
"""

import argparse
import logging

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

import autofit
from autofit import probe_kit


def make_trainer(candidate: autofit.Candidate) -> SFTTrainer:
    path = probe_kit.model_path(candidate)  # random weights from the model's configuration, cached once
    rows = probe_kit.synthetic_token_rows(candidate, candidate.max_length, probe_kit.probe_rows(candidate))
    return SFTTrainer(
        model=path,
        args=SFTConfig(**candidate.training_args()),
        train_dataset=Dataset.from_dict({"input_ids": rows}),  # worst case: every row at full length
        processing_class=probe_kit.load_tokenizer(candidate),
        peft_config=candidate.peft_config(),
        quantization_config=candidate.quantization_config(),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--out", default="autofit-out/example")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    where = (
        dict(model="Qwen/Qwen2.5-0.5B", device="cuda", gpu_memory="12GiB", max_length=1024)
        if options.gpu
        else dict(model="tiny-qwen2", device="cpu", gpu_memory="300MiB", max_length=128)
    )
    result = autofit.fit(
        make_trainer,
        effective_batch=8,
        training_args={"learning_rate": 1e-4, "lr_scheduler_type": "cosine"},
        out_dir=options.out,
        **where,
    )
    print("best:", result.candidate.describe(), "rungs:", ", ".join(result.candidate.rungs) or "none")
    print("SFTConfig arguments:", result.training_args)
    print("written:", result.best_yaml)


if __name__ == "__main__":
    main()
