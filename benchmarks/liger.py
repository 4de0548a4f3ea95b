"""Liger's kernels on the CPU meter: what the ledger says they save against what a probe measures.

Liger's Triton kernels need a GPU, so the probes here run TRL with the tests' stand-in package
(``tests/liger_stand_in``): plain torch autograd functions that save what Liger's RMSNorm and SwiGLU save and work in
place in the backward pass as Liger's do. The figures check the ledger's account of that contract; Triton's own
allocations and the kernels' speed are the GPU's to measure.

    .venv/bin/python -m benchmarks.liger [--write docs/benchmarks.md]   (make bench-liger)
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import List

from benchmarks.page import quick, table_main

ROOT = Path(__file__).resolve().parent.parent
STAND_IN = ROOT / "tests" / "liger_stand_in"
MODELS = Path(__file__).resolve().parent / "models"
# (model, algo, micro-batch, length): no checkpointing, where the kernels' saving is whole
WORKLOADS = [
    ("tiny-qwen2", "reward", 4, 512),
    ("tiny-qwen2", "sft", 4, 512),
    (str(MODELS / "tiny-llama"), "reward", 2, 1024),
]
QUICK_WORKLOADS = [("tiny-qwen2", "reward", 2, 256)]  # --quick: one small probe pair
MiB = 2**20


def table(root: Path) -> str:
    sys.path.insert(0, str(STAND_IN))
    from autofit import memory_model as mm
    from autofit.core import Candidate, LoraSettings, ProbeSettings
    from autofit.probe._worker import run_probe

    lines: List[str] = [
        "| model | algo | tokens | training | peak without MiB (measured / predicted) | with Liger | saved MiB "
        "(measured / predicted) | modules patched |", "|---|---|---:|---|---:|---:|---:|---:|"]
    for model, algo, batch, length in QUICK_WORKLOADS if quick() else WORKLOADS:
        factory = importlib.import_module(f"autofit.probe.algos.{algo}").build_trainer
        for lora in (None,) if quick() else (None, LoraSettings()):
            peaks, predicted, patched = [], [], 0
            for liger in (False, True):
                candidate = Candidate(algo=algo, model=model, device="cpu", micro_batch=batch, grad_accum=1,
                                      max_length=length, lora=lora, liger=liger,
                                      probe=ProbeSettings(steps=2, output_dir=str(root / "probe")))
                result = run_probe(factory, candidate, None)
                if not result.fits:
                    raise RuntimeError(f"{model} {algo} liger={liger}: {result.outcome.value} {result.error}")
                peaks.append(result.peak_bytes)
                predicted.append(mm.predict(candidate).total)
                patched = result.observed.get("liger_modules", patched)
            tokens = (2 if algo == "reward" else 1) * batch * length
            lines.append(
                f"| {Path(model).name} | {algo} | {tokens} | {'LoRA' if lora else 'full'} "
                f"| {peaks[0] / MiB:.1f} / {predicted[0] / MiB:.1f} | {peaks[1] / MiB:.1f} / {predicted[1] / MiB:.1f} "
                f"| {(peaks[0] - peaks[1]) / MiB:.1f} / {(predicted[0] - predicted[1]) / MiB:.1f} | {patched} |")
    return "\n".join(lines)


def main() -> None:
    table_main(__doc__.splitlines()[0], "liger", table)


if __name__ == "__main__":
    main()
