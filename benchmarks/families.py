"""The memory model against the CPU meter, family by family: tiny configurations of every decoder family that
transformers ships and builds (dense and mixture-of-experts), one probe each for SFT, GRPO and a reward model.

``python -m benchmarks.families [--write docs/benchmarks.md]`` prints the table (``make bench-families``);
``tests/memory_model/test_families.py`` runs the same probes for the (family, algorithm) pairs
``memory_model.CHECKED`` claims (GRPO for one family of each layout; this sweep measures every claim).
Configurations are written here, never downloaded; weights are random.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Dict, Optional, Tuple

from benchmarks.page import chosen, table_main

# Small enough to probe in about a second, big enough that activations are a fair share of the peak.
COMMON = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=8192, max_position_embeddings=4096, bos_token_id=8189,
              eos_token_id=8190, pad_token_id=8191)
FAMILIES: Dict[str, Dict] = {
    "llama": {}, "mistral": {}, "qwen2": {}, "qwen3": {"head_dim": 64}, "gemma": {}, "gemma2": {},
    "gemma3_text": {}, "phi3": {}, "olmo2": {}, "granite": {}, "cohere": {}, "starcoder2": {}, "glm4": {},
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
                      shared_expert_intermediate_size=256),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128),
    "olmoe": dict(num_experts=8, num_experts_per_tok=2),
}
ALGOS = ("sft", "grpo", "reward")
MICRO_BATCH, LENGTH = 4, 256
RL_COMPLETION, RL_PROMPT, RL_GENERATIONS = 64, 32, 2


def family_config(family: str) -> Dict:
    """The tiny configuration of ``family`` as transformers' config class completes it (float32, as on the CPU)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(family, **COMMON, **FAMILIES[family]).to_dict()
    config.pop("dtype", None)
    config["torch_dtype"] = "float32"
    return config


def write_family(family: str, root: Path) -> str:
    folder = root / family
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(family_config(family)))
    return str(folder)


def family_candidate(model: str, algo: str, output_dir: str, qlora: bool = False):
    from autofit.core import Candidate, LoraSettings, ProbeSettings

    fields = dict(algo=algo, model=model, device="cpu", micro_batch=MICRO_BATCH, grad_accum=1, max_length=LENGTH,
                  probe=ProbeSettings(steps=2, output_dir=output_dir))
    if algo in ("grpo", "rloo"):
        fields.update(max_length=RL_COMPLETION, prompt_length=RL_PROMPT, num_generations=RL_GENERATIONS)
    if qlora:
        fields.update(lora=LoraSettings(), quantization="4bit")
    return Candidate(**fields)


def measure(model: str, algo: str, output_dir: str, qlora: bool = False) -> Tuple[Optional[int], float, str]:
    """(measured peak bytes or None, predicted bytes, the probe's error) of one probe in this process."""
    from autofit.core import Outcome
    from autofit.memory_model import predict
    from autofit.probe import prepare_factory
    from autofit.probe._worker import run_probe

    candidate = family_candidate(model, algo, output_dir, qlora)
    result = run_probe(prepare_factory(algo).load(), candidate, None)
    measured = result.peak_bytes if result.outcome == Outcome.OK else None
    return measured, predict(candidate).total, result.error


def table(root: Path) -> str:
    from autofit.memory_model import ModelShape, ensure_census, unchecked_reason

    lines = ["| family | params (counted) | algo | measured MiB | predicted MiB | error | checked |",
             "|---|---:|---|---:|---:|---:|---|"]
    for family in chosen(list(FAMILIES)):
        model = write_family(family, root)
        ensure_census(model)
        shape = ModelShape.from_model(model)
        for algo in chosen(ALGOS):
            measured, predicted, error = measure(model, algo, str(root / "out"))
            checked = "yes" if unchecked_reason(shape, algo) is None else "no (band ±50%)"
            if measured is None:
                why = "transformers has no sequence-classification class for it" \
                    if "Unrecognized configuration class" in error else error[:60]
                lines.append(f"| {family} | {shape.parameters().total:,} | {algo} | fails: {why} | "
                             f"{predicted / 2**20:.2f} | | {checked} |")
                continue
            lines.append(f"| {family} | {shape.parameters().total:,} | {algo} | {measured / 2**20:.2f} | "
                         f"{predicted / 2**20:.2f} | {predicted / measured - 1:+.1%} | {checked} |")
    return "\n".join(lines)


def main() -> None:
    table_main(__doc__.splitlines()[0], "families", table, log_level=logging.ERROR)


if __name__ == "__main__":
    main()
