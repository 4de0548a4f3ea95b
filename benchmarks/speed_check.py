"""The speed model's check set (issue 60, item 5): published throughput rows the model is not fitted to, fixed on
2026-12-02 before any coefficient of the speed model changes, each run through the door a user types
(``autofit estimate --config FILE ... --json``, read from ``your_run.speed.tokens_per_second_per_gpu``), beside the
calibration set's error (the rows ``make bench-speed`` holds: fms-acceleration's A100 rows and autofit's H100 probes,
``benchmarks/speed_public.py``; torchtune's and torchao's pairs, ``benchmarks/speed_terms.py``).

The rule: a row of ``benchmarks/public/check/rows.csv`` never moves into the calibration, and no coefficient is
chosen by looking at it; every change to the speed model reports its error on both sets, the check set's first.

The rows: QwenLM/Qwen's README (commit 03cd81f), "Profiling of Memory and Speed": Qwen-1 1.8B and 7B on A100-SXM4-80G,
batch 1 with 8 accumulated, every row padded to its length, LoRA, Q-LoRA and the full fine-tune (DeepSpeed ZeRO-3),
in seconds per optimizer step; tokens/s per GPU = 8 x length / (s/iter). Each pair is two rows that differ by one
method at the same model, card, batch and length; what must hold is the direction of its ratio.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks.page import QUICK_ENV, chosen, replace_between
from benchmarks.speed_public import H100_ROWS, REPO, ROWS, autofit_cli, predicted

FOLDER = "benchmarks/public/check"
ROWS_FILE = REPO / FOLDER / "rows.csv"
FIXED = "2026-12-02"
MARKER = "speed-check"
FIELDS = ("key", "model", "gpu", "gpus", "micro_batch", "accumulation", "length", "method", "config", "measured",
          "unit", "tokens_per_step_per_gpu", "tokens_per_second_per_gpu", "source", "date_fixed", "not_expressed")


@dataclass(frozen=True)
class CheckRow:
    key: str
    model: str  # --model: a configuration folder (the hub is not reachable here)
    gpu: str  # --gpu-memory: the card's name
    gpus: int
    micro_batch: int
    accumulation: int
    length: int
    method: str  # full, lora, qlora
    config: str  # in FOLDER
    measured: float  # the source's figure, in ``unit``
    unit: str
    tokens_per_step_per_gpu: int
    tokens_per_second_per_gpu: float  # the measured figure as tokens/s per GPU
    source: str
    date_fixed: str
    not_expressed: str


def parse(record: Dict[str, str]) -> CheckRow:
    """One row of rows.csv, checked: its tokens/s is its tokens per step over its seconds per step."""
    missing = [name for name in FIELDS if name not in record]
    if missing:
        raise ValueError(f"{record.get('key', '?')}: missing {', '.join(missing)}")
    row = CheckRow(record["key"], record["model"], record["gpu"], int(record["gpus"]), int(record["micro_batch"]),
                   int(record["accumulation"]), int(record["length"]), record["method"], record["config"],
                   float(record["measured"]), record["unit"], int(record["tokens_per_step_per_gpu"]),
                   float(record["tokens_per_second_per_gpu"]), record["source"], record["date_fixed"],
                   record["not_expressed"])
    if row.unit != "s/iter":
        raise ValueError(f"{row.key}: unit {row.unit!r}: only s/iter (seconds per optimizer step) is converted")
    if row.tokens_per_step_per_gpu != row.micro_batch * row.accumulation * row.length:
        raise ValueError(f"{row.key}: tokens per step is not micro-batch x accumulation x length")
    if abs(row.tokens_per_step_per_gpu / row.measured - row.tokens_per_second_per_gpu) > 0.5:
        raise ValueError(f"{row.key}: tokens/s is not tokens per step over s/iter")
    return row


def load(path: Path = ROWS_FILE) -> List[CheckRow]:
    with path.open(newline="") as handle:
        return [parse(record) for record in csv.DictReader(handle)]


# Two rows that differ by one method alone (same model, card, batch, length); the 7B full fine-tune ran on two GPUs
# (per GPU the same batch), the one pair whose GPU count differs.
PAIRS: Tuple[Tuple[str, str, str], ...] = (
    ("LoRA / full", "qwen-1.8b-full-256", "qwen-1.8b-lora-256"),
    ("LoRA / full", "qwen-1.8b-full-1024", "qwen-1.8b-lora-1024"),
    ("LoRA / full", "qwen-1.8b-full-4096", "qwen-1.8b-lora-4096"),
    ("LoRA / full (full on 2 GPUs)", "qwen-7b-full-1024", "qwen-7b-lora-1024"),
    ("QLoRA / LoRA", "qwen-1.8b-lora-256", "qwen-1.8b-qlora-256"),
    ("QLoRA / LoRA", "qwen-1.8b-lora-1024", "qwen-1.8b-qlora-1024"),
    ("QLoRA / LoRA", "qwen-1.8b-lora-4096", "qwen-1.8b-qlora-4096"),
    ("QLoRA / LoRA", "qwen-7b-lora-1024", "qwen-7b-qlora-1024"),
    ("QLoRA / LoRA", "qwen-7b-lora-4096", "qwen-7b-qlora-4096"),
)


def command(row: CheckRow) -> Tuple[str, ...]:
    """What a user types (from the repository's root): their TRL file, its card, GPUs, model and length."""
    gpus = ("--gpus", str(row.gpus)) if row.gpus > 1 else ()
    return ("autofit", "estimate", "--config", f"{FOLDER}/{row.config}", *gpus, "--gpu-memory", row.gpu,
            "--model", row.model, "--max-length", str(row.length), "--json")


def predict(row: CheckRow) -> Dict[str, Any]:
    """The user's run of what the command prints: its tokens/s per GPU, its seconds by part, its configuration."""
    run = json.loads(autofit_cli(*command(row)[1:]))["estimates"][0]["your_run"]
    speed = run["speed"]
    return {"tokens_per_second_per_gpu": speed["tokens_per_second_per_gpu"],
            "seconds_per_step": speed["seconds_per_step"], "seconds_by_part": speed["seconds_by_part"],
            "describe": run["configuration"]["describe"]}


def _sign(ratio: float) -> int:
    return (ratio > 1) - (ratio < 1)


def pairs(results: Dict[str, Dict[str, Any]], rows: Dict[str, CheckRow]) -> List[Dict[str, Any]]:
    out = []
    for what, before, after in PAIRS:
        if before not in results or after not in results:
            continue
        measured = rows[after].tokens_per_second_per_gpu / rows[before].tokens_per_second_per_gpu
        predicted_ratio = (results[after]["tokens_per_second_per_gpu"]
                           / results[before]["tokens_per_second_per_gpu"])
        out.append({"pair": what, "before": before, "after": after, "measured_ratio": measured,
                    "predicted_ratio": predicted_ratio, "sign_agrees": _sign(measured) == _sign(predicted_ratio)})
    return out


def calibration() -> Dict[str, Any]:
    """The calibration set's error now, through the same door: the published fms rows and the H100 probes
    (``speed_public``), as ``make bench-speed`` prints them."""
    errors: Dict[str, float] = {}
    for row in chosen(ROWS) + chosen(H100_ROWS):
        errors[row.key] = predicted(row)[0] / row.published - 1
    published = [abs(errors[row.key]) for row in chosen(ROWS)]
    every = [abs(error) for error in errors.values()]
    return {"errors": errors, "mean_abs_error_published": statistics.mean(published),
            "mean_abs_error_all": statistics.mean(every), "rows": len(every), "published_rows": len(published)}


def run(with_calibration: bool = True) -> Dict[str, Any]:
    rows = load()
    by_key = {row.key: row for row in rows}
    results: Dict[str, Dict[str, Any]] = {}
    for row in chosen(rows, 2):
        result = predict(row)
        result["measured_tokens_per_second_per_gpu"] = row.tokens_per_second_per_gpu
        result["error"] = result["tokens_per_second_per_gpu"] / row.tokens_per_second_per_gpu - 1
        result["command"] = " ".join(command(row))
        results[row.key] = result
    errors = [result["error"] for result in results.values()]
    signs = pairs(results, by_key)
    summary: Dict[str, Any] = {
        "fixed": FIXED, "rows": results, "pairs": signs,
        "mean_abs_error": statistics.mean(abs(error) for error in errors),
        "mean_signed_error": statistics.mean(errors),
        "pair_signs_right": sum(pair["sign_agrees"] for pair in signs), "pair_count": len(signs),
        "command": "python -m benchmarks.speed_check"}
    if with_calibration:
        summary["calibration"] = calibration()
    return summary


def table(summary: Dict[str, Any]) -> str:
    rows = {row.key: row for row in load()}
    lines = ["| row | method | GPUs x batch x accumulation, length | command | measured (source) | measured tok/s per "
             "GPU | predicted | error | where the time goes (predicted) | not expressed |",
             "|---|---|---|---|---:|---:|---:|---:|---|---|"]
    for key, result in summary["rows"].items():
        row = rows[key]
        parts = result["seconds_by_part"]
        total = sum(parts.values())
        top = ", ".join(f"{name} {seconds / total:.0%}" for name, seconds in
                        sorted(parts.items(), key=lambda item: -item[1])[:3])
        lines.append(f"| {key} | {row.method} (`{result['describe']}`) | {row.gpus} x {row.micro_batch} x "
                     f"{row.accumulation}, {row.length} | `{result['command']}` | {row.measured:g} {row.unit} | "
                     f"{row.tokens_per_second_per_gpu:,.0f} | {result['tokens_per_second_per_gpu']:,.0f} | "
                     f"{result['error']:+.0%} | {top} | {row.not_expressed or '-'} |")
    lines += ["", "| pair | rows (before → after) | measured ratio | predicted ratio | direction |",
              "|---|---|---:|---:|---|"]
    for pair in summary["pairs"]:
        mark = "right" if pair["sign_agrees"] else "✗ wrong"
        lines.append(f"| {pair['pair']} | {pair['before']} → {pair['after']} | {pair['measured_ratio']:.2f} | "
                     f"{pair['predicted_ratio']:.2f} | {mark} |")
    text = (f"Check set (fixed {FIXED}, {len(summary['rows'])} rows): mean absolute error "
            f"**{summary['mean_abs_error']:.0%}** (mean signed {summary['mean_signed_error']:+.0%}); pair directions "
            f"right: **{summary['pair_signs_right']} of {summary['pair_count']}**.")
    if "calibration" in summary:
        cal = summary["calibration"]
        probes = cal["rows"] - cal["published_rows"]
        text += (f" Calibration set, the same door, now: mean absolute error "
                 f"**{cal['mean_abs_error_published']:.0%}** on its {cal['published_rows']} published rows "
                 f"(fms-acceleration's A100 rows), {cal['mean_abs_error_all']:.0%} with autofit's {probes} "
                 "H100 probes.")
    source = next(iter(rows.values())).source
    lines += ["", text + f" Source of every row: [QwenLM/Qwen README @ 03cd81f]({source}); measured: s/iter of an "
              "optimizer step of 8 rows padded to the length, as tokens/s per GPU = 8 x length / (s/iter). "
              "Predicted: the uncalibrated throughput model on the A100 80GB's published peaks, "
              "`your_run.speed.tokens_per_second_per_gpu` of what the command prints, nothing else. Not expressed, "
              "every row: the source's stack (transformers 4.32, PyTorch 2.0, Qwen-1's own modelling code) where "
              "the estimate prices TRL 1.16's; the Qwen-1 widths as a qwen2 configuration "
              "(`benchmarks/models/Qwen-*-as-qwen2`)."]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="the speed model against its check set (issue 60, item 5)")
    parser.add_argument("--write", help="replace the speed-check table in this markdown file")
    parser.add_argument("--json", help="write the figures as JSON to this file")
    parser.add_argument("--quick", action="store_true", help="two rows and one calibration row: to see it runs")
    parser.add_argument("--no-calibration", action="store_true", help="the check set alone")
    args = parser.parse_args(argv)
    if args.quick:
        if args.write or args.json:
            parser.error("--quick runs two rows: its table is not the page's (drop --write and --json)")
        os.environ[QUICK_ENV] = "1"
    summary = run(not args.no_calibration)
    body = table(summary)
    print(body)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    if args.write:
        path = Path(args.write)
        path.write_text(replace_between(path.read_text(), f"<!-- {MARKER}:begin -->", f"<!-- {MARKER}:end -->",
                                        body))


if __name__ == "__main__":
    main()
