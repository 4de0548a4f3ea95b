"""Optimizer offload where it is the answer: a full fine-tune that fits until the optimizer's first step.

Each workload is searched twice on the CPU meter, with the quality rungs that would otherwise answer it
(bf16 weights, 8-bit AdamW, LoRA) and with optimizer offload before them, and the table says what each answer
trains, its verified peak, the host memory the offloaded states took (measured and predicted) and its speed.

    .venv/bin/python -m benchmarks.offload [--write docs/benchmarks.md]     (make bench-offload; part of make bench)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from benchmarks.page import chosen, quick, table_main

MODELS = Path(__file__).resolve().parent / "models"
QUALITY = ["bf16-weights", "optimizer-8bit", "lora"]
# (name, model, algo, budget MiB): budgets below the plain full fine-tune's optimizer step, above offload's peak
WORKLOADS = [
    ("qwen2 sft", "tiny-qwen2", "sft", 70),
    ("qwen2 reward", "tiny-qwen2", "reward", 52),
    ("llama sft", str(MODELS / "tiny-llama"), "sft", 64),
]
LENGTH, EFFECTIVE_BATCH = 32, 1
MiB = 2**20


def search(model: str, algo: str, budget_mib: int, ladder: List[str], out: Path) -> Dict:
    from autofit._api import fit

    fit(f"autofit.probe.algos.{algo}:build_trainer", model=model, algo=algo, device="cpu",
                 gpu_memory=f"{budget_mib}MiB", max_length=LENGTH, effective_batch=EFFECTIVE_BATCH, ladder=ladder,
                 out_dir=out, quiet=True)
    data = json.loads((out / "best.json").read_text())
    return {"rungs": "+".join(data["rungs"]) or "none", "peak": data["peak_bytes"],
            "tps": data.get("tokens_per_second"), "probes": data["probes"], "engine": data.get("engine")}


def table(root: Path) -> str:
    lines = ["| workload | budget | ladder | answer | verified peak MiB | host MiB (measured / predicted) | tok/s | "
             "probes |", "|---|---:|---|---|---:|---:|---:|---:|"]
    for name, model, algo, budget in chosen(WORKLOADS):
        ladders = (("quality rungs", QUALITY), ("offload first", ["optimizer-offload"] + QUALITY))
        for label, ladder in ladders[1:] if quick() else ladders:  # quick: the offloading search alone
            row = search(model, algo, budget, ladder, root / f"{name.replace(' ', '-')}-{len(ladder)}")
            engine = row["engine"] or {}
            host = (f"{engine['host_bytes'] / MiB:.1f} / {engine['host_bytes_predicted'] / MiB:.1f}"
                    if engine.get("host_bytes") else "-")
            peak = f"{row['peak'] / MiB:.1f}" if row["peak"] else "-"
            lines.append(f"| {name} | {budget} MiB | {label} | {row['rungs']} | {peak} | {host} | "
                         f"{row['tps'] or 0:,.0f} | {row['probes']} |")
    return "\n".join(lines)


def main() -> None:
    table_main(__doc__.splitlines()[0], "offload", table)


if __name__ == "__main__":
    main()
