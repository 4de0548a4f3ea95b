"""``autofit estimate --json`` (issue 39, item 4): the whole estimate as one JSON document on stdout and nothing else,
drawn from the same objects as the text, so every level and figure the text prints is in the JSON with the same
number; bad input stays one line on stderr, exit 2, and no JSON at all."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from autofit import cli
from autofit.core import format_size

GiB, MiB = 2**30, 2**20
REPO = Path(__file__).resolve().parents[2]
O1 = ["--config", "benchmarks/public/O1.yaml", "--gpu-memory", "A100-80GB",
      "--model", "benchmarks/models/Meta-Llama-3-8B"]
TERM_COLUMNS = {"weights": ("weights",), "grads": ("gradients",), "optim": ("optimizer",),
                "activ": ("activations",), "logits": ("logits",), "gen": ("generation",), "ref": ("reference",),
                "ctx+alloc": ("cuda_context", "allocator")}


def estimate(capsys, *argv: str) -> Tuple[str, Dict[str, Any]]:
    """The text (``--wide``: every term a column) and the JSON document of the same command."""
    assert cli.main(["estimate", *argv, "--wide"]) == 0
    text = capsys.readouterr().out
    assert cli.main(["estimate", *argv, "--json"]) == 0
    printed = capsys.readouterr().out
    return text, json.loads(printed)  # json.loads fails on anything beside the one document


def unit_of(estimate_json: Dict[str, Any]) -> Tuple[str, float]:
    budget = estimate_json["question"]["budget"]["bytes"]
    return ("GiB", GiB) if budget >= 2 * GiB else ("MiB", MiB)


def cell(size: Dict[str, Any], scale: float) -> str:
    return f"{size['bytes'] / scale:.2f}"


def level_rows(text: str) -> List[Dict[str, str]]:
    """The levels table of one card's text, as header -> cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("lvl "))
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = []
    for line in lines[start + 1:]:
        if not re.match(r"\s*\d+\s", line):
            break
        rows.append(dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=True)))
    return rows


def check_levels(text: str, card: Dict[str, Any]) -> None:
    """Every cell of every level row the text prints is the JSON's figure for that level, to the printed digit."""
    unit, scale = unit_of(card)
    rows = level_rows(text)
    assert len(rows) == len(card["levels"]) > 1
    for row, level in zip(rows, card["levels"], strict=True):
        assert int(row["lvl"]) == level["level"]
        assert row["batch"] == f"{level['configuration']['micro_batch']}x{level['configuration']['grad_accum']}"
        assert int(row["len"]) == level["configuration"]["max_length"]
        if level["adds"]:
            assert row["rung (cumulative)"].split()[0] == "+" + level["adds"]
            assert row["rung (cumulative)"].split()[1:] == ["-" + name for name in level["leaves_out"]]
        for header, terms in TERM_COLUMNS.items():
            total = sum(level["terms"][term]["bytes"] for term in terms)
            assert row[header] == f"{total / scale:.2f}", (level["level"], header)
        assert row["peak"] == cell(level["peak"], scale) and row["±"] == cell(level["band"], scale)
        assert row["phase"] == level["phase"]
        assert row["fits"].rstrip("?") == ("yes" if level["fits"] else "no")
        assert row["fits"].endswith("?") == (level["verdict"] == "maybe")
        if "host" in row:
            assert row["host"] == (cell(level["host"], scale) if level["host"]["bytes"] else "-")
        if "tok/s" in row:
            assert row["tok/s"] == f"{level['speed']['tokens_per_second']:,.0f}"
        else:
            assert level["speed"] is None


def check_expected(text: str, card: Dict[str, Any]) -> None:
    """The answer ("use:", first after the header, and its figures' line after the table) is the JSON's ``answer``."""
    lines = text.splitlines()
    use = next(i for i, line in enumerate(lines) if line.startswith("use: "))
    assert use == 1  # the line after the header
    answer = card["answer"]
    if answer is None:
        assert card["expected"] is None
        assert "nothing is predicted to fit" in lines[use] and format_size(card["lightest"]["peak"]["bytes"]) in \
            lines[use]
        return
    assert lines[use].startswith(f"use: level {answer['level']} ") and answer["configuration"]["describe"] in \
        lines[use]
    assert lines[use + 1] == f"  why: {answer['why']}"
    named = [line for line in lines[use + 2:] if line.startswith("  or (")]
    assert [int(line.split("level ")[1].split()[0]) for line in named] == \
        [other["level"] for other in answer["alternatives"]]
    figures = next(line for line in lines if line.startswith(f"use, level {answer['level']} "))
    assert f"predicts {format_size(answer['peak']['bytes'])} ± {format_size(answer['band']['bytes'])}" in figures
    if card["question"]["device"] == "cuda":
        assert f"PyTorch allocates {format_size(answer['pytorch']['bytes'])}" in figures
        assert f"nvidia-smi shows {format_size(answer['nvidia_smi']['bytes'])}" in figures


def check_phases(text: str, card: Dict[str, Any]) -> None:
    """The text's "your run at each phase" table is the JSON's ``your_run.phases``, row for row."""
    run = card["your_run"]
    lines = text.splitlines()
    line = next(line for line in lines if line.startswith("your run ("))
    assert f"predicts {format_size(run['peak']['bytes'])} ± {format_size(run['band']['bytes'])}" in line
    assert f"at its peak ({run['phase']})" in line
    start = next(i for i, line in enumerate(lines) if line.startswith("your run at each phase"))
    header = re.split(r"\s{2,}", lines[start + 1].strip())
    _, scale = unit_of(card)
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 2:start + 2 + len(run["phases"])]]
    for cells, phase in zip(rows, run["phases"], strict=True):
        row = dict(zip(header, cells, strict=False))
        assert row["phase"] == phase["label"]
        for name in ("weights", "grads", "optim", "activ", "logits", "gen", "ref"):
            assert row[name] == cell(phase["terms"][TERM_COLUMNS[name][0]], scale), (phase["phase"], name)
        if "PyTorch" in row:
            assert row["PyTorch"] == cell(phase["pytorch"], scale) and row["+alloc"] == cell(phase["allocator"], scale)
            assert row["+ctx"] == cell(phase["cuda_context"], scale)
            assert row["nvidia-smi"] == cell(phase["nvidia_smi"], scale)
        assert (cells[-1] == "peak") == phase["peak"]
    assert sum(phase["peak"] for phase in run["phases"]) == 1
    peak = next(phase for phase in run["phases"] if phase["peak"])
    assert peak["phase"] == run["phase"] and peak["nvidia_smi"] == run["nvidia_smi"]


def test_a_deepspeed_file_its_levels_phases_and_expected_level_are_the_texts_numbers(capsys):
    text, document = estimate(capsys, *O1)
    assert document["schema"] == 1 and document["comparison"] is None and len(document["estimates"]) == 1
    card = document["estimates"][0]
    assert card["card"] == "A100-80GB" and card["question"]["budget"]["bytes"] == 80 * GiB
    assert card["question"]["config"] == "benchmarks/public/O1.yaml"
    check_levels(text, card)
    check_expected(text, card)
    check_phases(text, card)
    phases = {phase["phase"]: phase for phase in card["your_run"]["phases"]}
    # O1's published figure, after the first backward, is a phase of its own (ZeRO: no Adam states yet)
    assert list(phases) == ["first_backward", "train", "backward", "step"]
    assert phases["first_backward"]["terms"]["optimizer"]["bytes"] < phases["step"]["terms"]["optimizer"]["bytes"]
    assert card["your_run"]["fits"] is False and card["your_run"]["phase"] == "step"
    for note in card["notes"]:  # every note the text prints, none printed that the JSON lacks
        assert f"note: {note}" in text
    assert text.count("\nnote: ") == len(card["notes"])
    assert any("optimizer-offload" in note for note in card["rungs_left_out"])
    speed = card["speed"]
    assert speed["card"] == "A100-80GB" and speed["fastest"]
    fastest = speed["fastest"][0]
    assert (f"fastest predicted fit: level {fastest['level']} " in text
            and f"{fastest['tokens_per_second']:,.0f} tok/s, {fastest['seconds_per_step']:.2f} s per optimizer step"
            in text)


@pytest.mark.parametrize("argv", [
    ("--model", "Qwen/Qwen2.5-7B", "--algo", "grpo", "--gpu-memory", "H100"),
    ("--model", "Qwen/Qwen2.5-7B", "--algo", "ppo", "--gpu-memory", "A100-80GB"),
    ("--model", "Qwen/Qwen2.5-0.5B", "--algo", "reward", "--gpu-memory", "8GiB"),
    ("--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "200MiB", "--max-length", "128"),
], ids=["grpo", "ppo", "reward-size", "sft-cpu"])
def test_each_algo_prints_the_same_levels_in_json_and_text(capsys, argv):
    text, document = estimate(capsys, *argv)
    card = document["estimates"][0]
    assert card["question"]["algo"] == (argv[argv.index("--algo") + 1] if "--algo" in argv else "sft")
    assert card["your_run"] is None  # no --config: the flags' baseline is level 0
    check_levels(text, card)
    check_expected(text, card)
    if "--algo" in argv and argv[argv.index("--algo") + 1] in ("grpo", "ppo"):  # the update's phases, in the text
        phases = card["answer"]["phase_totals"]
        assert "generation" in phases
        _, scale = unit_of(card)
        by_phase = next(line for line in text.splitlines() if "by phase" in line)
        for name, total in phases.items():
            assert f"{name} {cell(total, scale)}" in by_phase
    if card["question"]["device"] == "cpu" or "8GiB" in argv:  # a size names no card: no speed is guessed
        assert card["speed"] is None and all(level["speed"] is None for level in card["levels"])


def test_several_gpus_shard_and_the_json_says_each_levels_engine(capsys):
    text, document = estimate(capsys, "--model", "Qwen/Qwen2.5-7B", "--gpus", "8", "--gpu-memory", "H100")
    card = document["estimates"][0]
    assert card["question"]["gpus"] == 8 and "per GPU" in text.splitlines()[0]
    check_levels(text, card)
    engines = {level["configuration"]["sharding"] for level in card["levels"]}
    assert {"zero1", "zero2", "zero3", "fsdp2"} <= engines
    assert all(level["configuration"]["ranks"] == 8 for level in card["levels"])
    assert card["levels"][0]["terms"]["cuda_context"]["bytes"] > GiB // 2  # NCCL's buffers beside the context


def test_several_cards_are_one_document_with_their_comparison(capsys):
    text, document = estimate(capsys, "--model", "Qwen/Qwen2.5-7B", "--algo", "grpo", "--gpu-memory", "H100,L4")
    cards = document["estimates"]
    assert [card["card"] for card in cards] == ["H100", "L4"]
    texts = text.split("\n\nautofit estimate: ")
    assert len(texts) == 2
    for one, card in zip(texts, cards, strict=True):
        check_levels(one, card)
        check_expected(one, card)
    table = text[text.index("cards compared"):].splitlines()[2:]
    assert len(table) == len(document["comparison"]) == 2
    for line, row in zip(table, document["comparison"], strict=True):
        cells = re.split(r"\s{2,}", line.strip())
        assert cells[0] == row["card"] and cells[1] == format_size(row["budget"]["bytes"])
        assert cells[2].startswith(f"{row['expected_level']} ") and cells[3] == format_size(
            row["expected_peak"]["bytes"])
        assert cells[4].startswith(f"{row['fastest_level']} ") and cells[5] == f"{row['tokens_per_second']:,.0f}"


@pytest.mark.parametrize("argv", [
    ("--model", "tiny-qwen2", "--gpu-memory", "lots"),
    ("--model", "tiny-qwen2", "--gpu-memory", "H100,lots"),  # the second card is refused: nothing of the first
    ("--model", "tiny-qwen2", "--gpu-memory", "H100,L4", "--plot", "x.svg"),
    ("--config", "no-such-file.yaml", "--gpu-memory", "H100"),
    ("--model", "tiny-qwen2", "--gpu-memory", "H100", "--no-such-flag"),  # argparse's refusal: a document too
], ids=["bad-size", "bad-second-card", "plot-of-two", "no-file", "argparse"])
def test_bad_input_is_one_line_on_stderr_and_a_document_without_estimates(argv):
    """Issue 61, item 5: an agent reads every answer as data, a refusal too (it was nothing on stdout)."""
    done = subprocess.run([sys.executable, "-m", "autofit.cli", "estimate", *argv, "--json"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("autofit: error: ") and done.stderr.count("\n") == 1, done.stderr
    document = json.loads(done.stdout)
    assert document["exit"] == {"code": 2, "reason": "bad_input", "meaning": document["exit"]["meaning"],
                                "message": done.stderr.removeprefix("autofit: error: ").rstrip("\n")}
    assert document["command"] == "estimate" and document["estimates"] == [] and document["comparison"] is None


def test_the_json_is_the_only_thing_on_stdout_of_the_command():
    done = subprocess.run([sys.executable, "-m", "autofit.cli", "estimate", *O1, "--json"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["estimates"][0]["your_run"]["phases"]
    assert document["exit"]["code"] == 0 and document["exit"]["reason"] == "estimated"
