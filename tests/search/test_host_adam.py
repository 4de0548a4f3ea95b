"""The host's AdamW timed by the child module the search runs (``python -m autofit.probe._host_adam THREADS``):
torch's rate per thread, and DeepSpeed's CPUAdam's where its extension is built (null where not)."""

from __future__ import annotations

import json
import subprocess
import sys

from autofit.search import _machine_rates


def test_the_child_prints_torchs_rate_per_thread_and_cpu_adams_or_null():
    # waited for longer than a search waits (``HOST_ADAM_TIMEOUT_S``): under the whole suite's load what is checked
    # is what it measures
    done = subprocess.run([sys.executable, "-m", "autofit.probe._host_adam", "1"], capture_output=True, text=True,
                          timeout=300, check=True)
    rates = json.loads(done.stdout.strip().splitlines()[-1])
    assert rates["threads"] == 1 and 1e8 < rates["bandwidth"] < 1e13  # bytes a second of a copy on every core
    assert 1e6 < rates["torch"] < 1e11  # parameters a second on one core: a real timing, not a constant
    assert rates["deepspeed"] is None or 1e6 < rates["deepspeed"] < 1e12


def test_the_search_keeps_the_measurement_for_the_next(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOFIT_CACHE", str(tmp_path))
    monkeypatch.setattr(_machine_rates, "_RATES", {})
    monkeypatch.setattr(_machine_rates, "HOST_ADAM_TIMEOUT_S", 300)
    first = _machine_rates.host_adam_rates(1)
    assert first is not None and first["torch"] > 0
    monkeypatch.setattr(_machine_rates, "_RATES", {})  # another process
    monkeypatch.setattr(_machine_rates.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert _machine_rates.host_adam_rates(1) == first


def test_a_measurement_that_failed_is_not_waited_for_again_for_ten_minutes(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOFIT_CACHE", str(tmp_path))
    monkeypatch.setattr(_machine_rates, "_RATES", {})
    runs = []

    def run(argv, **kwargs):
        runs.append(argv)
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    monkeypatch.setattr(_machine_rates.subprocess, "run", run)
    assert _machine_rates.host_adam_rates(1) is None and len(runs) == 1
    monkeypatch.setattr(_machine_rates, "_RATES", {})  # the next estimate's process
    assert _machine_rates.host_adam_rates(1) is None and len(runs) == 1  # the assumed rates, no second wait
