"""This machine's rates are measured once and kept for ``MAX_AGE_S``: the next search on the same machine reads them
(about 10 s of CPU saved on two cores); an older measurement, another machine's or a file autofit did not write as
it writes them is measured again."""

from __future__ import annotations

import json
import subprocess

import pytest

from autofit.machine import RATE_NAMES
from autofit.search import _machine_rates

MEASURED = {"flops": 2e11, "bandwidth": 3e10, "op_seconds": 1e-4, "half_rows": 16.0, "elementwise_seconds": 6e-10}


@pytest.fixture
def measurements(monkeypatch, tmp_path):
    """The child's measurement, counted; a fresh process's state and an empty cache."""
    runs = []

    def run(argv, **kwargs):
        runs.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(MEASURED) + "\n", stderr="")

    monkeypatch.setattr(_machine_rates.subprocess, "run", run)
    monkeypatch.setattr(_machine_rates, "_RATES", {})
    monkeypatch.setenv("AUTOFIT_CACHE", str(tmp_path))
    return runs


def next_search(monkeypatch):
    monkeypatch.setattr(_machine_rates, "_RATES", {})  # another search process


def kept(tmp_path):
    return tmp_path / "rates" / "rates.json"


def test_a_second_search_reads_the_first_ones_rates(measurements, monkeypatch, tmp_path):
    expected = tuple(MEASURED[name] for name in RATE_NAMES)
    assert _machine_rates.machine_rates() == expected and len(measurements) == 1
    assert _machine_rates.machine_rates() == expected and len(measurements) == 1  # the same process: once
    next_search(monkeypatch)
    assert _machine_rates.machine_rates() == expected and len(measurements) == 1  # kept
    assert json.loads(kept(tmp_path).read_text())["rates"] == MEASURED


@pytest.mark.parametrize("change", ["older", "another machine", "threads", "not autofit's"])
def test_what_is_not_this_machines_recent_measurement_is_measured_again(measurements, monkeypatch, tmp_path, change):
    _machine_rates.machine_rates()
    entry = json.loads(kept(tmp_path).read_text())
    if change == "older":
        entry["measured_at"] -= _machine_rates.MAX_AGE_S + 1
    elif change == "another machine":
        entry["machine"]["host"] = "elsewhere"
    elif change == "threads":
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
    if change == "not autofit's":
        kept(tmp_path).write_text("{not json")
    else:
        kept(tmp_path).write_text(json.dumps(entry))
    next_search(monkeypatch)
    _machine_rates.machine_rates()
    assert len(measurements) == 2


def test_a_cache_that_cannot_be_written_still_gives_the_rates(measurements, monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("AUTOFIT_CACHE", str(blocked))  # not a folder: nothing can be kept
    assert _machine_rates.machine_rates() == tuple(MEASURED[name] for name in RATE_NAMES)
    next_search(monkeypatch)
    _machine_rates.machine_rates()
    assert len(measurements) == 2
