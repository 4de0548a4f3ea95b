"""Issue 61, item 2: "nothing fits" names the knob that blocks, with the value that would fit where the memory model
can say it; a search that probes nothing does not measure the machine's rates; no message prints a Python repr or a
path the user did not type. The issue's case: DPO on tiny-qwen2 in the demo's 300 MiB, at the default length 1,024."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from autofit._api import no_fit_message
from autofit.core import FIELDS, SearchOptions
from autofit.memory_model import expected_rung
from autofit.rungs import resolve_ladder
from autofit.search import Search, _machine_rates, question


class NoRunner:
    def run(self, *args, **kwargs):
        raise AssertionError("a probe ran: the memory model rules every candidate out")


@pytest.fixture
def no_rates(monkeypatch):
    """The machine's rates are measured for the throughput model of timed probes only: here, never."""

    def measured(*args):
        raise AssertionError("the machine's rates were measured for a search that probed nothing")

    monkeypatch.setattr(_machine_rates, "_measured", measured)
    monkeypatch.setattr(_machine_rates, "_kept", lambda *args: None)
    monkeypatch.setattr(_machine_rates, "_RATES", {})


def dpo_report(tmp_path, **changes):
    options = dict(model="tiny-qwen2", algo="dpo", device="cpu", gpu_memory="300MiB", out_dir=tmp_path / "out")
    options.update(changes)
    spec = question(SearchOptions(**options))
    return spec, Search(spec, NoRunner(), resolve_ladder(spec.ladder)).run()


def test_nothing_fits_at_the_default_length_names_max_length_and_the_length_that_fits(tmp_path, no_rates):
    spec, report = dpo_report(tmp_path)
    assert not report.fits and not report.records  # nothing probed: the memory model ruled everything out
    message = no_fit_message(report)
    found = re.search(r"--max-length (\d+)", message)
    assert found, message
    length = int(found.group(1))
    assert 0 < length < 1024
    # the length named is one the memory model predicts to fit
    at = question(SearchOptions(model="tiny-qwen2", algo="dpo", device="cpu", gpu_memory="300MiB", max_length=length))
    assert expected_rung(at).expected is not None
    assert message.index("--max-length") < message.index("--gpu-memory")  # the knob that blocks comes first


def test_no_message_prints_a_python_repr_or_a_path_not_typed(tmp_path, no_rates):
    _, report = dpo_report(tmp_path)
    message = no_fit_message(report)
    assert not re.search(r"\[|\(\'|\{", message), message  # no list, tuple or dict repr
    assert str(tmp_path) not in message and sys.executable not in message


def test_the_rates_measurement_is_bounded_to_seconds_and_its_failure_names_no_command(monkeypatch, caplog):
    seen = {}

    def run(argv, **kwargs):
        seen.update(kwargs)
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(_machine_rates.subprocess, "run", run)
    monkeypatch.setattr(_machine_rates, "_RATES", {})
    monkeypatch.setattr(_machine_rates, "_kept", lambda *args: None)
    with caplog.at_level("DEBUG", logger="autofit"):
        assert _machine_rates.machine_rates() is None
    assert seen["timeout"] <= 30
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "rates" in text and "[" not in text and sys.executable not in text


def test_max_length_help_names_every_algorithm_that_reads_it():
    help_text = FIELDS["max_length"].metadata["help"]
    for algo in ("sft", "reward", "dpo", "kto"):
        assert algo in help_text
    assert "grpo" not in help_text
