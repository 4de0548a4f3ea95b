"""Issue 61, item 1 ("No GPU, no trap"): on a machine without a GPU a search simulates the device in the host's
memory, so one whose first probe would need more than the host has available is refused at once: one line naming
both and the estimate command that answers without a GPU, written with the user's flags; no probe starts, nothing is
written. The headline command without --gpu-memory says the same first. A search that fits the host still runs."""

from __future__ import annotations

import pytest

from autofit import cli
from autofit.core import InputError, SearchOptions
from autofit.search import _host_memory, _question, question

GiB = 2**30
HOST = 24 * GiB  # this machine's MemAvailable, as the issue's: fixed, whatever runs the test


@pytest.fixture(autouse=True)
def no_gpu_and_no_probes(monkeypatch, tmp_path):
    """No CUDA (``--device auto`` is the CPU, as here), a host with ``HOST`` available, and no probe or search may
    start."""

    class NoRunner:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a probe runner was created")

    def no_search(*args, **kwargs):
        raise AssertionError("the search started")

    import autofit._api

    monkeypatch.setattr(autofit._api, "ProcessRunner", NoRunner)
    monkeypatch.setattr(autofit._api, "Search", no_search)
    real = _question.resolve_device
    monkeypatch.setattr(_question, "resolve_device", lambda device: "cpu" if device == "auto" else real(device))
    monkeypatch.setattr(_host_memory, "available_host_bytes", lambda: HOST)


def refusal(argv, capsys):
    code = cli.main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_BAD_INPUT == 2
    assert len(lines) == 1, lines
    return lines[0]


def test_a_gpu_sized_search_on_the_cpu_is_refused_with_the_estimate_command(tmp_path, capsys):
    out = tmp_path / "out"
    line = refusal(["search", "--model", "Qwen/Qwen2.5-7B", "--algo", "grpo", "--gpu-memory", "H100",
                    "--out", str(out)], capsys)
    assert line.startswith("autofit: error: no GPU here")
    assert "24.00 GiB" in line  # the host's available memory
    assert "79.65 GiB" in line and "predicted" in line  # the budget, and the first probe's predicted peak
    assert "`autofit estimate --model Qwen/Qwen2.5-7B --algo grpo --gpu-memory H100`" in line
    assert not out.exists()  # no study, no probe folder, no checkpoint


def test_the_headline_command_without_gpu_memory_says_the_same_first(tmp_path, capsys):
    line = refusal(["search", "--model", "Qwen/Qwen2.5-7B", "--algo", "grpo", "--out", str(tmp_path / "o")], capsys)
    assert "--gpu-memory is required" not in line
    assert line.startswith("autofit: error: no GPU here") and "24.00 GiB" in line and "predicted" in line
    assert "`autofit estimate --model Qwen/Qwen2.5-7B --algo grpo --gpu-memory H100`" in line


def test_the_estimate_command_keeps_the_users_own_flags(tmp_path, capsys):
    line = refusal(["search", "--model", "Qwen/Qwen2.5-7B", "--algo", "grpo", "--gpu-memory", "H100",
                    "--max-completion-length", "256", "--effective-batch", "16", "--ladder", "micro-batch,lora",
                    "--out", str(tmp_path / "o")], capsys)
    assert ("`autofit estimate --model Qwen/Qwen2.5-7B --algo grpo --gpu-memory H100 --max-completion-length 256 "
            "--effective-batch 16 --ladder micro-batch,lora`") in line
    assert str(tmp_path) not in line  # --out is the search's, not the estimate's


def test_a_budget_above_the_host_is_refused_where_no_memory_model_predicts(monkeypatch):
    monkeypatch.setattr(_host_memory, "predicted_first_probe", lambda spec: None)
    with pytest.raises(InputError, match=r"whole 79\.65 GiB budget of --gpu-memory H100.*24\.00 GiB available"):
        question(SearchOptions(model="tiny-qwen2", device="cpu", gpu_memory="H100", max_length=128))


def test_a_search_that_fits_the_host_still_runs():
    # make demo's search, and the same tiny model under a card's budget: its probes are predicted far below the host
    assert question(SearchOptions(model="tiny-qwen2", device="cpu", gpu_memory="300MiB", max_length=128))
    assert question(SearchOptions(model="tiny-qwen2", device="cpu", gpu_memory="H100", max_length=128))


def test_the_demo_is_refused_on_a_host_with_less_than_its_budget(monkeypatch):
    monkeypatch.setattr(_host_memory, "available_host_bytes", lambda: 100 * 2**20)
    with pytest.raises(InputError, match=r"100\.00 MiB available"):
        question(SearchOptions(model="tiny-qwen2", device="cpu", gpu_memory="300MiB", max_length=128))


def test_a_small_model_without_gpu_memory_is_still_asked_for_one(tmp_path, capsys):
    line = refusal(["search", "--model", "tiny-qwen2", "--device", "cpu", "--out", str(tmp_path / "o")], capsys)
    assert "--gpu-memory is required on the CPU" in line
