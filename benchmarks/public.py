"""The memory model against peaks measured on real GPUs and published for the Hugging Face stack
(``shared/notes/public-measurements.md``): each run as its source states it, a TRL config file in
``benchmarks/public/``, estimated the way ``autofit estimate --config FILE`` does, at the engine the source ran
(``make bench-public``; the table between the "public" markers of docs/benchmarks.md). No probe, no GPU.

The published figure and what it measures are the source's; where our stack or our ledger cannot express a setting
of the source, the row names it beside its error rather than fitting a coefficient to it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from autofit.core import Candidate, SearchOptions, format_size
from autofit.memory_model import Ledger, base_candidate, phase_ledgers
from autofit.search import estimate_question, with_config
from benchmarks.page import chosen, table_main

ROOT = Path(__file__).resolve().parent
GB = 10**9
GIB = 2**30
H100_80GB = 85_017_493_504  # torch's total memory of an H100 80GB HBM3 (shared/notes/gpu-2026-11-22.md)
A100_80GB = 85_198_045_184  # torch's total memory of an A100 80GB


@dataclass(frozen=True)
class Published:
    """One published run: its file (``benchmarks/public/``), the model's configuration folder (the hub is not
    reachable here), the GPUs, the engine our ledger puts in the source's place, and what was measured."""

    key: str
    what: str
    config: str
    model: str
    gpus: int
    card: int
    engine: Optional[str]  # the sharding our ledger models for the source's engine (None: one GPU, plain)
    measured: Tuple[float, float]  # bytes: the published figure (a range, or one value twice)
    phase: Optional[str]  # the ledger's phase the figure is of (None: the peak)
    reading: str  # what the figure is, in the source's words
    not_expressed: str  # the source's settings our stack or ledger does not express


ROWS = (
    Published("F1", "Llama-2-70B LoRA r=8 all-linear, FSDP full shard, 8 x H100, batch 8 x 4, 2048 tokens",
              "F1.yaml", "Llama-2-70b-hf", 8, H100_80GB, "fsdp2", (72 * GB, 80 * GB), None,
              "72-80 GB per GPU (90-98%, a chart; nvidia-smi style)",
              "FSDP version 1 with flat parameters and every LoRA leaf its own unit (we model FSDP2); the 2024 TRL "
              "and transformers loss with full-vocabulary fp32 logits (TRL 1.16 uses its chunked LM head); the "
              "figure spans the whole run, the final save included"),
    Published("F2", "Llama-2-70B QLoRA (NF4, nested), FSDP full shard, 2 GPUs, batch 2 x 2, 2048 tokens",
              "F2.yaml", "Llama-2-70b-hf", 2, H100_80GB, "fsdp2", (35.6 * GB, 35.6 * GB), None,
              "35.6 GB per GPU (tool and GPU not stated)",
              "FSDP version 1 over bitsandbytes' 4-bit storage (we model FSDP2); the 2024 full-vocabulary fp32 "
              "loss; reentrant checkpointing"),
    Published("O1", "Llama-3-8B full SFT, DeepSpeed ZeRO-2, 1 x A100 80GB, batch 1, 128 tokens, after backward",
              "O1.yaml", "Meta-Llama-3-8B", 1, A100_80GB, None, (61 * GIB, 61 * GIB), "backward",
              "61 (GiB) after the backward pass; out of memory at the optimizer step",
              "OpenRLHF's trainer (not TRL); its DeepSpeed settings are the file's (`deepspeed:`)"),
)


def candidate_of(row: Published) -> Candidate:
    """The run's configuration as the estimate reads its file, at its engine."""
    values = with_config({"config": str(ROOT / "public" / row.config), "model": str(ROOT / "models" / row.model),
                          "gpus": row.gpus, "gpu_memory": row.card, "device": "cuda"})
    candidate = base_candidate(estimate_question(SearchOptions(**values)))
    return candidate if row.engine is None else candidate.replace(sharding=row.engine)


def predict(row: Published) -> Dict[str, Ledger]:
    """The run's ledgers by phase."""
    return {ledger.phase: ledger for ledger in phase_ledgers(candidate_of(row), device="cuda")}


# DeepSpeed's fp32 master weights exist from the engine's setup; Adam's two states only from the first step. The
# ledger's steady-state phases hold all 12 bytes per parameter; the first backward, which O1 measured, 4 of them.
ZERO_MASTER_SHARE = 4 / 12


def first_backward(ledger: Ledger) -> Tuple[float, float]:
    """(nvidia-smi, PyTorch) of the train phase before the first optimizer step: no Adam states yet."""
    adam = ledger.optimizer * (1 - ZERO_MASTER_SHARE)
    return ledger.total - ledger.reserved_factor * adam, ledger.allocated - adam


def _gb(value: float) -> str:
    return f"{value / GB:.1f} GB"


def table(_: Path) -> str:
    lines = ["| run | configuration (as its source states it) | published | predicted: nvidia-smi (PyTorch) | "
             "error | not expressed |",
             "|---|---|---|---|---|---|"]
    for row in chosen(ROWS):
        ledgers = predict(row)
        peak = max(ledgers.values(), key=lambda found: found.total)
        ledger = ledgers[row.phase] if row.phase else peak
        shown, allocated, where = ledger.total, ledger.allocated, ledger.phase
        extra = ""
        if row.phase == "backward" and "deepspeed" in dict(candidate_of(row).user_args):
            (shown, allocated), where = first_backward(ledger), "first backward"
            extra = (f"; step {format_size(peak.total)}: "
                     + ("out of memory, as published" if peak.total > row.card else "fits, unlike the source"))
        low, high = row.measured
        middle = (low + high) / 2
        error = (shown - middle) / middle
        inside = " (inside the range)" if low <= shown <= high else ""
        lines.append(f"| {row.key} | {row.what} | {row.reading} | {_gb(shown)} ({_gb(allocated)}) [{where}]{extra} "
                     f"| {error:+.1%}{inside} | {row.not_expressed} |")
    lines.append("")
    lines.append("Predicted: `autofit estimate --config benchmarks/public/<run>.yaml` at the source's engine (our "
                 "FSDP2 for its FSDP; O1's DeepSpeed configuration is its file's), uncalibrated; nvidia-smi = "
                 "reserved memory plus the CUDA context (and NCCL's buffers with several GPUs), the figure the search "
                 "holds against the budget; PyTorch = `max_memory_allocated`. Error against the published figure (a "
                 "range's middle).")
    return "\n".join(lines)


def main() -> None:
    table_main(__doc__.splitlines()[0], "public", table, logging.ERROR)


if __name__ == "__main__":
    main()
