"""Activation offloading against checkpointing on the CPU meter: the search's answers and the ledger's error.

Part one searches long-sequence workloads twice, with checkpointing as the only activation rung and with TRL's
activation offloading after it, and says what each answer trains, its verified peak, the host memory the offloaded
activations took at most (measured / predicted) and its speed. Part two probes each workload's model with and
without checkpointing under offloading and compares the device peak and the host memory with the ledger's.

On the CPU the accelerator is the CPU itself (``autofit.rungs.activation_offload._probe``): the copies cost a memcpy,
not a PCIe transfer, so the throughput says nothing about a GPU.

    .venv/bin/python -m benchmarks.activation_offload [--write docs/benchmarks.md]   (make bench-activation-offload)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from benchmarks.page import quick, table_main

MODELS = Path(__file__).resolve().parent / "models"
CHECKPOINTING = ["micro-batch", "checkpointing"]
OFFLOADING = CHECKPOINTING + ["activation-offload"]
# (name, model, algo, length, effective batch, budget MiB): budgets under the plain run at the full batch
WORKLOADS = [
    ("qwen2 reward", "tiny-qwen2", "reward", 1024, 2, 150),
    ("qwen2 reward", "tiny-qwen2", "reward", 2048, 2, 200),
    ("gemma3 reward", str(MODELS / "tiny-gemma3"), "reward", 1024, 2, 220),
]
# --quick: one short workload under a budget that holds it (the searches' paths and the ledger's, in seconds)
QUICK_WORKLOADS = [("qwen2 reward", "tiny-qwen2", "reward", 256, 2, 1024)]
MiB = 2**20


def chosen() -> List:
    return QUICK_WORKLOADS if quick() else WORKLOADS


def search(model: str, algo: str, length: int, batch: int, budget_mib: int, ladder: List[str], out: Path) -> Dict:
    from autofit._api import fit

    fit(f"autofit.probe.algos.{algo}:build_trainer", model=model, algo=algo, device="cpu",
        gpu_memory=f"{budget_mib}MiB", max_length=length, effective_batch=batch, ladder=ladder, out_dir=out, quiet=True)
    data = json.loads((out / "best.json").read_text())
    return {"answer": data["candidates"][0]["candidate"] if data.get("candidates") else "-",
            "rungs": "+".join(data["rungs"]) or "none", "peak": data["peak_bytes"],
            "tps": data.get("tokens_per_second"), "probes": data["probes"], "host": data.get("host_memory") or {}}


def answers(root: Path) -> List[str]:
    lines = ["| workload | length | budget | ladder | answer | verified peak MiB | host MiB (measured / predicted) | "
             "tok/s | probes |", "|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for name, model, algo, length, batch, budget in chosen():
        for label, ladder in (("checkpointing", CHECKPOINTING), ("+ activation offload", OFFLOADING)):
            row = search(model, algo, length, batch, budget, ladder, root / f"{name.replace(' ', '-')}-{length}-"
                                                                              f"{len(ladder)}")
            host = row["host"]
            host_text = (f"{host['activation_bytes'] / MiB:.1f} / {host['predicted_bytes'] / MiB:.1f}"
                         if host.get("activation_bytes") else "-")
            peak = f"{row['peak'] / MiB:.1f}" if row["peak"] else "-"
            lines.append(f"| {name} | {length} | {budget} MiB | {label} | {row['rungs']} | {peak} | {host_text} | "
                         f"{row['tps'] or 0:,.0f} | {row['probes']} |")
    return lines


def prediction_errors(root: Path) -> List[str]:
    import importlib

    from autofit import memory_model as mm
    from autofit.core import Candidate, ProbeSettings
    from autofit.probe._worker import run_probe

    lines = ["| model | algo | tokens | checkpointing | device peak MiB (measured / predicted) | error | "
             "host MiB (measured / predicted) | error |", "|---|---|---:|---|---:|---:|---:|---:|"]
    seen = set()
    for _, model, algo, length, batch, _ in chosen():
        for checkpointing in (False, True):
            point = (model, algo, length, checkpointing)
            if point in seen:
                continue
            seen.add(point)
            candidate = Candidate(algo=algo, model=model, device="cpu", micro_batch=batch, grad_accum=1,
                                  max_length=length, checkpointing=checkpointing, activation_offload=True,
                                  probe=ProbeSettings(steps=2, output_dir=str(root / "grid")))
            factory = importlib.import_module(f"autofit.probe.algos.{algo}").build_trainer
            result = run_probe(factory, candidate, None)
            predicted = mm.predict(candidate).total
            host = result.stats.get("activation_host_bytes", 0)
            host_predicted = mm.host_bytes(candidate, mm.ModelShape.from_model(model), "cpu")
            lines.append(
                f"| {Path(model).name} | {algo} | {candidate.micro_batch}x{length} "
                f"| {'on' if checkpointing else 'off'} "
                f"| {result.peak_bytes / MiB:.1f} / {predicted / MiB:.1f} | {predicted / result.peak_bytes - 1:+.1%} "
                f"| {host / MiB:.1f} / {host_predicted / MiB:.1f} | {host_predicted / host - 1:+.1%} |")
    return lines


def table(root: Path) -> str:
    return "\n".join(answers(root) + [""] + prediction_errors(root))


def main() -> None:
    table_main(__doc__.splitlines()[0], "activation-offload", table)


if __name__ == "__main__":
    main()
