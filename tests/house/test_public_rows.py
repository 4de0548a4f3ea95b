"""The published rows of ``make bench-public`` (benchmarks/public.py, issue 59 item 6): every row's TRL file parses
and sets only keys the key table classifies, every GRPO row runs vLLM as its source did, every row holds a figure
or an outcome to check, and the table's error cell reads the verdict right for each kind of row. Fast: no estimate
is run (the estimate is faked), so this checks the rows' wiring, not the memory model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

import benchmarks.public as public
from autofit.memory_model._key_table import classify

REPO = Path(__file__).resolve().parents[2]
ALL_ROWS = public.ROWS + public.PREFERENCE_ROWS + public.GRPO_ROWS


def test_the_keys_are_unique_and_the_grpo_rows_are_at_least_three():
    keys = [row.key for row in ALL_ROWS]
    assert len(keys) == len(set(keys))
    assert len(public.GRPO_ROWS) >= 3


@pytest.mark.parametrize("row", ALL_ROWS, ids=lambda row: row.key)
def test_each_row_file_parses_and_every_key_is_classified(row):
    written = yaml.safe_load((REPO / "benchmarks" / "public" / row.config).read_text())
    assert isinstance(written, dict) and written
    assert [key for key in written if classify(key) is None] == []  # no key the estimate would skip unnamed
    assert row.measured is not None or row.card is not None  # a figure or an outcome: the row checks something
    command = public.command(row)
    assert command[:4] == ("autofit", "estimate", "--config", f"benchmarks/public/{row.config}")
    assert command[-1] == "--json" and "--gpu-memory" in command


@pytest.mark.parametrize("row", public.GRPO_ROWS, ids=lambda row: row.key)
def test_each_grpo_row_runs_vllm_as_its_source_did(row):
    written = yaml.safe_load((REPO / "benchmarks" / "public" / row.config).read_text())
    assert written["use_vllm"] is True and written["vllm_mode"] in ("colocate", "server")
    assert ("--algo", "grpo") == tuple(row.flags[row.flags.index("--algo"):][:2])


def _found(fits: bool, peak: float) -> Dict[str, Any]:
    return {"peak": peak, "allocated": peak * 0.9, "phase": "backward", "fits": fits, "host": 0,
            "phases": {"backward": (peak, peak * 0.9, "backward")}}


def test_the_error_cell_reads_each_kind_of_row(monkeypatch, tmp_path):
    rows = {row.key: row for row in public.GRPO_ROWS}
    answers = {"G6": _found(True, 20 * 2**30), "G7": _found(True, 71.75 * 2**30), "G8": _found(True, 18 * 2**30),
               "G12": _found(False, 150 * 2**30)}
    monkeypatch.setattr(public, "ROWS", ())
    monkeypatch.setattr(public, "PREFERENCE_ROWS", ())
    monkeypatch.setattr(public, "GRPO_ROWS", tuple(rows[key] for key in answers))
    monkeypatch.setattr(public, "memory_table", lambda: "")
    monkeypatch.setattr(public, "estimate", lambda row: answers[row.key])
    lines = {line.split(" | ")[0].removeprefix("| "): line for line in public.table(tmp_path).splitlines()
             if line.startswith("| G")}
    assert "| fits, unlike the source |" in lines["G6"]  # published out of memory, predicted to fit
    assert "| +2.5% |" in lines["G7"]  # 71.75 GiB against the published 70 GiB
    assert "not comparable" in lines["G8"] and "fits, unlike" not in lines["G8"]  # the vLLM GPU's, not sized
    assert "| does not fit, unlike the source |" in lines["G12"]  # published as running
