"""``make gpu-check``: autofit's scenarios on a real GPU, each search followed by a plain-TRL replay of its answer,
written to ``docs/gpu/<date>-<gpu>.md``.

    python -m benchmarks.gpu_check --out /tmp/gpu-check [--scenarios sft-0.5b,grpo-7b] [--page docs/gpu/X.md]

Every scenario is an ``autofit search`` command in its own process, with its own ``--out`` under ``--out``: run
the command again and finished searches are reused (the study resumes) and finished replays are read back, so the
check can be split over several calls of a time-limited machine. The replay (``benchmarks/replay.py``) trains the
exported configuration with TRL alone for ``--replay-steps`` steps under the same emulated budget, in a process
that imports no autofit code. The page is written from whatever has finished; a scenario still missing says so.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from autofit.core import installed_versions

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
REPLAY = REPO / "benchmarks" / "replay.py"
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets", "optuna")


@dataclass(frozen=True)
class Scenario:
    name: str
    args: Sequence[str]  # autofit search arguments, --out aside
    what: str  # what the scenario must show
    replay_steps: Optional[int] = None  # None: --replay-steps


SCENARIOS = (
    Scenario("sft-0.5b-batch", ["--model", "Qwen/Qwen2.5-0.5B", "--gpu-memory", "12GiB", "--max-length", "1024"],
             "Qwen2.5-0.5B SFT at 12 GiB, largest micro-batch"),
    Scenario("sft-0.5b-length", ["--model", "Qwen/Qwen2.5-0.5B", "--gpu-memory", "12GiB", "--maximize", "length",
                                 "--max-length", "32768", "--min-length", "512", "--effective-batch", "1"],
             "Qwen2.5-0.5B SFT at 12 GiB, longest sequence up to 32768"),
    Scenario("grpo-0.5b", ["--model", "Qwen/Qwen2.5-0.5B", "--algo", "grpo", "--gpu-memory", "24GiB"],
             "Qwen2.5-0.5B GRPO at 24 GiB (completions of 512, prompts of 128)", replay_steps=5),
    Scenario("grpo-7b", ["--model", "Qwen/Qwen2.5-7B", "--algo", "grpo"],
             "Qwen2.5-7B GRPO on the whole card", replay_steps=3),
    Scenario("llama-8b-full", ["--model", "meta-llama/Llama-3.1-8B", "--gpu-memory", "80GB", "--max-length", "128",
                               "--effective-batch", "1"],
             "Llama-3.1-8B full fine-tune, micro-batch 1, length 128, AdamW at 80 GB: the optimizer step's OOM seen "
             "and named"),
    Scenario("reward-gemma-length", ["--model", "google/gemma-3-1b-it", "--algo", "reward", "--gpu-memory", "16GiB",
                                     "--maximize", "length", "--max-length", "32768", "--min-length", "1024",
                                     "--effective-batch", "1"],
             "gemma-3-1b-it reward model at 16 GiB, longest sequence up to 32768"),
    # Activation offloading against checkpointing (issue 10): the same long-context reward search with and without it.
    Scenario("reward-1.5b-16k-ckpt", ["--model", "Qwen/Qwen2.5-1.5B", "--algo", "reward", "--gpu-memory", "40GiB",
                                      "--max-length", "16384", "--effective-batch", "4",
                                      "--ladder", "micro-batch,checkpointing"],
             "Qwen2.5-1.5B reward model at 16k tokens, 40 GiB, checkpointing only: the throughput to beat"),
    Scenario("reward-1.5b-16k-offload", ["--model", "Qwen/Qwen2.5-1.5B", "--algo", "reward", "--gpu-memory", "40GiB",
                                         "--max-length", "16384", "--effective-batch", "4",
                                         "--ladder", "micro-batch,checkpointing,activation-offload"],
             "the same with activation offloading: kept only where faster; host RAM measured"),
    # Liger's kernels (issue 10): where liger-kernel travels with the wheels (gpu-wheels.sh ... liger-kernel==X), the
    # same 0.5B SFT question with the free rung first; without the package it is left out with a note.
    Scenario("sft-0.5b-liger", ["--model", "Qwen/Qwen2.5-0.5B", "--gpu-memory", "12GiB", "--max-length", "1024",
                                "--ladder", "liger-kernels,micro-batch,checkpointing"],
             "Qwen2.5-0.5B SFT at 12 GiB with Liger's kernels first: measured against sft-0.5b-batch"),
    # Big models (issue 18): probed from weightless checkpoints, so neither the disk nor the host holds the model.
    Scenario("sft-32b", ["--model", "Qwen/Qwen2.5-32B", "--gpu-memory", "80GB", "--max-length", "2048"],
             "Qwen2.5-32B SFT at 80 GB, 2048 tokens: which rungs, verified, in minutes", replay_steps=3),
    Scenario("sft-70b-qlora", ["--model", "meta-llama/Llama-3.1-70B", "--gpu-memory", "80GB", "--max-length", "2048",
                               "--ladder", "micro-batch,checkpointing,lora,quant-4bit"],
             "Llama-3.1-70B at 80 GB, 2048 tokens, on the QLoRA rungs only", replay_steps=3),
)


def gpu_name() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else name
    except Exception:  # noqa: BLE001 - no pynvml, no driver or no device all mean the same here
        return "no GPU"


def search_args(scenario: Scenario, out: Path, extra: Sequence[str]) -> List[str]:
    return ["search", *scenario.args, *extra, "--out", str(out)]


def run_scenario(scenario: Scenario, root: Path, extra: Sequence[str], replay_steps: int, timeout_s: float) -> None:
    """Search (resumed when it ran before), then replay its answer once."""
    out = root / scenario.name
    out.mkdir(parents=True, exist_ok=True)
    command = search_args(scenario, out, extra)
    started = time.perf_counter()
    with open(out / "search.log", "a") as log_file:
        try:
            done = subprocess.run([sys.executable, "-m", "autofit.cli", *command], stdout=log_file,
                                  stderr=subprocess.STDOUT, timeout=timeout_s)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = None
    wall = time.perf_counter() - started
    runs = json.loads((out / "runs.json").read_text()) if (out / "runs.json").exists() else []
    runs.append({"command": shlex.join(["autofit", *command]), "exit": code, "wall_s": round(wall, 1)})
    (out / "runs.json").write_text(json.dumps(runs, indent=2))
    best_path = out / "best.json"
    if code != 0 or not best_path.exists() or (out / "replay.json").exists():
        return
    steps = scenario.replay_steps or replay_steps
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and Path(p).resolve() != REPO)  # the carried wheels, not this repo
    env["REPLAY_OUTPUT_DIR"] = str(out / "replay-trainer")
    # an offloading answer is replayed the way it is launched: under accelerate with the exported engine config
    engine = json.loads(best_path.read_text()).get("engine") or {}
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", engine["accelerate_config"]] \
        if engine else [sys.executable]
    with open(out / "replay.log", "a") as log_file:
        try:
            subprocess.run([*launcher, str(REPLAY), str(best_path), "--steps", str(steps),
                            "--out", str(out / "replay.json"), *offline_model(best_path)],
                           stdout=log_file, stderr=subprocess.STDOUT,
                           timeout=timeout_s, env=env, cwd=str(out))
        except subprocess.TimeoutExpired:
            (out / "replay.json").write_text(json.dumps({"outcome": "TIMEOUT", "steps": steps, "peak_bytes": None}))


def offline_model(best_path: Path) -> List[str]:
    """A hub id cannot be downloaded on the GPU machines: the replay loads the weightless checkpoint the probes
    loaded (its weights stay zeros there, with no autofit code to fill them: the same memory)."""
    from autofit import probe_kit
    from autofit.machine import resolve_model

    best = json.loads(best_path.read_text())
    name = best["model_args"]["model_name_or_path"]
    if Path(name).is_dir():
        return []
    return ["--model-path", str(probe_kit.random_checkpoint(resolve_model(best["model"]).config, best["model"]))]


def _gib(value: Optional[float]) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def _peak_phase(phase_peaks: Dict[str, int]) -> str:
    return max(phase_peaks, key=phase_peaks.get) if phase_peaks else "-"


def scenario_section(scenario: Scenario, root: Path) -> List[str]:
    out = root / scenario.name
    lines = [f"## {scenario.name}: {scenario.what}", ""]
    runs = json.loads((out / "runs.json").read_text()) if (out / "runs.json").exists() else []
    if not runs:
        return lines + ["Not run.", ""]
    lines.append("```")
    lines += [f"$ {run['command']}   # exit {run['exit']}, {run['wall_s']:.0f} s" for run in runs]
    lines.append("```")
    lines.append(f"Wall time, all calls: {sum(run['wall_s'] for run in runs):.0f} s.")
    best_path = out / "best.json"
    if not best_path.exists():
        return lines + ["", "No best.json: the search did not finish (run the check again to resume it).", ""]
    best = json.loads(best_path.read_text())
    lines.append("")
    if best.get("stopped"):
        lines.append(f"Stopped: {best['stopped']}")
    if best["fits"]:
        verified = best["verified"]
        lines += [
            f"Chosen: rungs {', '.join(best['rungs']) or 'none'} ({best['cost_class']}); config "
            f"`{json.dumps({k: v for k, v in best['config'].items() if k not in ('use_cpu', 'bf16')})}`",
            f"Verified peak {_gib(verified['peak_bytes'])} of {_gib(best['budget_bytes'])} over {verified['steps']} "
            f"steps; the peak was set in phase `{_peak_phase(verified['phase_peaks'])}`; "
            f"{best['tokens_per_second']:,.0f} tok/s"
            + (f", generation {best['generation_tokens_per_second']:,.0f} tok/s"
               if best.get("generation_tokens_per_second") else ""),
        ]
    else:
        lines.append(f"Nothing fits; smallest OOM peak {_gib(best.get('smallest_oom_peak_bytes'))}.")
    lines += ["", "| # | kind | rungs | candidate | outcome | phase | predicted | measured | error |",
              "|---|---|---|---|---|---|---|---|---|"]
    for index, c in enumerate(best["candidates"], 1):
        error = (c.get("error") or "").replace("|", "/")[:80]
        lines.append(f"| {index} | {c['kind']} | {'+'.join(c['rungs']) or 'baseline'} | {c['candidate']} | "
                     f"{c['outcome']} | {c.get('error_phase') or '-'} | {_gib(c.get('predicted_bytes'))} | "
                     f"{_gib(c['peak_bytes'])} | {error} |")
    replay_path = out / "replay.json"
    lines.append("")
    if replay_path.exists():
        replay = json.loads(replay_path.read_text())
        verdict = "no OOM" if replay["outcome"] == "OK" else replay["outcome"]
        compare = ""
        if replay.get("peak_bytes") and best.get("fits"):
            ratio = replay["peak_bytes"] / best["verified"]["peak_bytes"]
            compare = (f", peak {_gib(replay['peak_bytes'])} against autofit's verified "
                       f"{_gib(best['verified']['peak_bytes'])} ({ratio:.3f}x)")
        lines.append(f"Plain-TRL replay ({replay.get('steps')} steps, no autofit code in the process, "
                     f"same emulated budget): {verdict}{compare}.")
    elif best["fits"]:
        lines.append("Plain-TRL replay: not run yet.")
    return lines + [""]


def page(root: Path, scenarios: Sequence[Scenario], command: str) -> str:
    today = datetime.date.today().isoformat()
    lines = [f"# autofit on {gpu_name()}, {today}", "",
             f"Written by `{command}` (benchmarks/gpu_check.py). Versions: "
             + ", ".join(f"{k} {v}" for k, v in installed_versions(PACKAGES).items() if v) + ".", ""]
    for scenario in scenarios:
        lines += scenario_section(scenario, root)
    return "\n".join(lines)


def page_path(docs: Path) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name().lower()).strip("-") or "no-gpu"
    return docs / f"{datetime.date.today().isoformat()}-{slug}.md"


def main(argv: Optional[Sequence[str]] = None, scenarios: Sequence[Scenario] = SCENARIOS) -> int:
    parser = argparse.ArgumentParser(description="autofit's GPU scenarios, with plain-TRL replays")
    parser.add_argument("--out", required=True, help="results folder (searches resume from it)")
    parser.add_argument("--scenarios", help=f"comma-separated subset of: {', '.join(s.name for s in scenarios)}")
    parser.add_argument("--replay-steps", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds per search and per replay")
    parser.add_argument("--page", help="page to write (default docs/gpu/<date>-<gpu>.md)")
    parser.add_argument("--search-arg", action="append", default=[], help="extra autofit search argument")
    parser.add_argument("--skip-run", action="store_true", help="only write the page from what has finished")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    chosen = list(scenarios)
    if args.scenarios:
        names = args.scenarios.split(",")
        unknown = [n for n in names if n not in {s.name for s in scenarios}]
        if unknown:
            parser.error(f"unknown scenario(s) {', '.join(unknown)}")
        chosen = [s for s in scenarios if s.name in names]
    root = Path(args.out)
    if not args.skip_run:
        for scenario in chosen:
            log.info("scenario %s", scenario.name)
            run_scenario(scenario, root, args.search_arg, args.replay_steps, args.timeout)
    target = Path(args.page) if args.page else page_path(REPO / "docs" / "gpu")
    target.parent.mkdir(parents=True, exist_ok=True)
    command = "make gpu-check" + (f" SCENARIOS={args.scenarios}" if args.scenarios else "")
    target.write_text(page(root, scenarios, command) + "\n")
    log.info("wrote %s", target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
