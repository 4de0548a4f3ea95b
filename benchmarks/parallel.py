"""Probes side by side (issue 49): the probe rounds on the critical path and the wall time of the same search with
1, 2 and 4 slots, and, by simulation, with 8.

1. **On the CPU**, through the door a user uses: `autofit search --model tiny-qwen2 --device cpu --gpu-memory 100MiB
   --max-length 64 --verify-steps 3 [--gpus-for-probes 0,...]`, real probes on simulated devices (each its own
   process, meter and budget). The rounds are best.json's `side_by_side.rounds` (one a probe where they run one at a
   time); the wall time is this machine's, whose cores the devices share.
2. **A node of 8 GPUs, simulated**: the search's own walk (``autofit.search.Search`` over ``SlotRunner``) for
   Qwen2.5-7B GRPO on one H100 80GB (shared/notes/gpu-2026-11-22.md) and Llama-3.1-8B SFT on a 24 GB card, where
   a probe's peak is the memory model's prediction on that card (3.1% mean error against the H100's 22 fitting
   probes) and its time the recorded one (a 7B GRPO probe of 2 steps took 74 s there, its verification 255 s).
   Time runs 200 times faster than recorded; the wall column is the recorded seconds of the probes the walk waited
   for, one per round (the search's own work is left out: it runs in the user's process, beside the probes).

    .venv/bin/python -m benchmarks.parallel [--write docs/benchmarks.md]   (make bench-parallel)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

from benchmarks.page import chosen, quick, table_main

CPU_SEARCH = ["--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "100MiB", "--max-length", "64",
              "--verify-steps", "3", "-q"]
PROBE_S, VERIFY_S = 74.0, 255.0  # recorded on the H100 for Qwen2.5-7B GRPO (shared/notes/gpu-2026-11-22.md, part 3)
SPEEDUP = 200.0  # simulated time runs this much faster than recorded
SIMULATED = [  # (what, model, algo, card, card bytes as torch reports them, the memory model guides the walk)
    ("Qwen2.5-7B GRPO, H100 80GB", "Qwen/Qwen2.5-7B", "grpo", "H100", 85_017_493_504, True),
    ("Llama-3.1-8B SFT, 24 GB card", "meta-llama/Llama-3.1-8B", "sft", "RTX4090", 24 * 2**30, True),
    ("Qwen2.5-7B GRPO, H100 80GB, --no-predict", "Qwen/Qwen2.5-7B", "grpo", "H100", 85_017_493_504, False),
]


def cpu_search(folder: Path, slots: int) -> Dict:
    out = folder / f"cpu-{slots}"
    devices = ["--gpus-for-probes", ",".join(map(str, range(slots)))] if slots > 1 else []
    started = time.perf_counter()
    door = Path(sys.executable).with_name("autofit")  # the command a user types, from this environment
    subprocess.run([str(door), "search", *CPU_SEARCH, "--out", str(out), *devices], check=True, capture_output=True,
                   timeout=1800)
    wall = time.perf_counter() - started
    best = json.loads((out / "best.json").read_text())
    side = best["side_by_side"] or {"rounds": best["probes_this_run"], "started": best["probes_this_run"]}
    return {"rounds": side["rounds"], "started": side["started"], "walked": best["probes_this_run"], "wall": wall,
            "answer": best["verified"]["candidate"] + f" [{'+'.join(best['rungs'])}]"}


class LedgerRunner:
    """A simulated probe on ``card``: its peak the memory model's prediction, its time the recorded one (scaled)."""

    def __init__(self, shape, card, budget_bytes: int, probe_steps: int):
        self.shape, self.card, self.budget_bytes, self.probe_steps = shape, card, budget_bytes, probe_steps

    def run(self, candidate, steps, **plan):
        from autofit import memory_model
        from autofit.core import Outcome, ProbeResult

        seconds = VERIFY_S if steps > self.probe_steps else PROBE_S
        time.sleep(seconds / SPEEDUP)
        peak = int(memory_model.predict(candidate, self.shape, device="cuda").total)
        if peak > self.budget_bytes:
            return ProbeResult(Outcome.OOM, peak_bytes=peak, steps=steps, error="simulated OOM", error_phase="train")
        speed = memory_model.predict_speed(candidate, self.shape, self.card).tokens_per_second
        return ProbeResult(Outcome.OK, peak_bytes=peak, steps=steps, seconds=seconds, tokens_per_second=speed)


def simulated_search(folder: Path, model: str, algo: str, card_name: str, card_bytes: int, predict: bool,
                     slots: int) -> Dict:
    from autofit import memory_model
    from autofit.core import SearchOptions, SearchSpec, card_named
    from autofit.rungs import resolve_ladder
    from autofit.search import Search, SlotRunner, quiet_optuna

    out = folder / f"{algo}-{card_name}-{predict}-{slots}"
    options = SearchOptions(model=model, algo=algo, device="cuda", out_dir=out, predict=predict)
    spec = SearchSpec.plan(options, device="cuda", gpu_bytes=card_bytes)
    assert spec.budget_bytes is not None
    runner = LedgerRunner(memory_model.shape_or_none(model), card_named(card_name), spec.budget_bytes,
                          spec.options.probe_steps)
    slotted = SlotRunner(runner, [str(i) for i in range(slots)])
    try:
        with quiet_optuna():
            report = Search(spec, slotted, resolve_ladder(None)).run()
    finally:
        slotted.close()
    walked = len([r for r in report.records if not r.cached])
    answer = report.chosen.candidate if report.chosen else None
    return {"rounds": slotted.rounds, "started": slotted.started, "walked": walked, "wall": slotted.critical_s,
            "answer": f"{answer.describe()} [{'+'.join(answer.rungs)}]" if answer else "nothing fits"}


def rows_for(name: str, results: List[Tuple[int, Dict]], unit: str) -> List[str]:
    serial = results[0][1]
    rows = []
    for slots, r in results:
        same = "same" if r["answer"] == serial["answer"] else f"**differs**: {r['answer']}"
        rows.append(f"| {name} | {slots} | {r['walked']} | {r['started']} | {r['rounds']} "
                    f"({r['rounds'] / serial['rounds']:.2f}) | {r['wall']:,.0f} {unit} "
                    f"({r['wall'] / serial['wall']:.2f}) | {serial['answer'] if slots == 1 else same} |")
    return rows


def table(folder: Path) -> str:
    import logging

    logging.getLogger("autofit").setLevel(logging.WARNING)
    rows = ["| search | slots | runs the search took (verifications included) | probes started | rounds (of one "
            "slot's) | wall (of one slot's) | answer |", "|---|---:|---:|---:|---:|---:|---|"]
    if not quick():  # real probes take a minute a search; the quick run walks the simulated one
        rows += rows_for("tiny-qwen2 SFT, CPU, 100 MiB (real probes)",
                         [(n, cpu_search(folder, n)) for n in (1, 2, 4)], "s")
    for name, model, algo, card, card_bytes, predict in chosen(SIMULATED):
        results = [(n, simulated_search(folder, model, algo, card, card_bytes, predict, n))
                   for n in chosen([1, 2, 4, 8], 2)]
        rows += rows_for(f"{name} (simulated)", results, "s recorded")
    command = "make bench-parallel" + (" QUICK=1" if quick() else "")
    return "\n".join(rows) + f"\n\nMeasured with `{command}` ({time.strftime('%Y-%m-%d')})."


if __name__ == "__main__":
    table_main(__doc__.splitlines()[0], "parallel", table)
