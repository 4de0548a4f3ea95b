"""The host's AdamW, measured and priced per core (issue 60, item 3): an offloaded optimizer step takes each rank's
shard on its share of the node's cores at the rate measured on this machine; ``autofit estimate`` planning for
another machine says which rate and how many cores it priced, and ``--host-cores`` names the training machine's."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Dict

import pytest

from autofit import cli
from autofit.machine import GpuInfo
from autofit.memory_model import CARDS
from autofit.search import _machine_rates, host_card

TORCH, CPU_ADAM = 2e8, 1e9  # a host's rates per core, as the child would print them
LLAMA_8B = ["--model", "benchmarks/models/Meta-Llama-3-8B", "--algo", "sft", "--gpu-memory", "A100-80GB",
            "--gpus", "8", "--max-length", "1024"]


@pytest.fixture
def measured(monkeypatch):
    """This machine's AdamW as measured on one thread (the child's JSON), without running the child."""
    monkeypatch.setattr(_machine_rates, "_RATES",
                        {"host-adam-1.json": {"threads": 1, "torch": TORCH, "deepspeed": CPU_ADAM}})


def estimate(capsys, *argv: str) -> Dict[str, Any]:
    assert cli.main(["estimate", *LLAMA_8B, *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["estimates"][0]


def host_seconds(document: Dict[str, Any], rung: str) -> float:
    level = next(level for level in document["levels"] if rung in level["rungs"])
    return level["speed"]["seconds_by_part"]["optimizer (host)"]


def test_the_offloaded_step_is_the_models_parameters_over_the_nodes_cores_at_the_measured_rate(capsys, measured):
    few, more = estimate(capsys, "--host-cores", "2"), estimate(capsys, "--host-cores", "4")
    parameters = few["memory_model"]["parameters"]
    assert host_seconds(few, "zero3-offload") == pytest.approx(parameters / (CPU_ADAM * 2), rel=1e-9)
    assert host_seconds(few, "fsdp2-offload") == pytest.approx(parameters / (TORCH * 2), rel=1e-9)  # torch's AdamW
    assert host_seconds(more, "zero3-offload") == pytest.approx(host_seconds(few, "zero3-offload") / 2, rel=1e-9)
    host = few["speed"]["host"]
    assert (host["torch_adam_per_core"], host["cpu_adam_per_core"], host["cores"]) == (TORCH, CPU_ADAM, 2)
    assert not host["cores_assumed"] and host["source"] == "measured here on one thread"


def test_past_what_the_hosts_memory_moves_more_cores_step_no_faster(capsys, measured):
    document = estimate(capsys, "--host-cores", "512")
    host, parameters = document["speed"]["host"], document["memory_model"]["parameters"]
    assert host["bandwidth_assumed"]  # planning for another machine: a server's bandwidth
    # DeepSpeed's fused step moves 28 bytes a parameter, torch's loop 80: the bandwidth binds, not the cores
    assert host_seconds(document, "zero3-offload") == pytest.approx(parameters * 28 / host["bandwidth"], rel=1e-9)
    assert host_seconds(document, "fsdp2-offload") == pytest.approx(parameters * 80 / host["bandwidth"], rel=1e-9)


def test_planning_for_another_machine_says_the_rate_and_the_cores_it_assumed(capsys, measured):
    document = estimate(capsys)
    assert document["speed"]["host"]["cores"] == 8 * 8 and document["speed"]["host"]["cores_assumed"]
    assert cli.main(["estimate", *LLAMA_8B]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("host optimizer step"))
    assert "200M" in line and "1,000M" in line and "measured here on one thread" in line, line
    assert "64 cores" in line and "--host-cores N" in line, line


def test_a_host_not_measured_is_priced_at_the_assumed_rates_and_says_so(capsys, monkeypatch):
    monkeypatch.setattr(_machine_rates, "_RATES", {"host-adam-1.json": None})  # the child timed out, or failed
    host = estimate(capsys, "--host-cores", "32")["speed"]["host"]
    assert host["source"].startswith("assumed rates") and host["cores"] == 32
    assert 0 < host["torch_adam_per_core"] < host["cpu_adam_per_core"]


def test_cpu_adam_not_built_is_priced_from_torchs_measured_rate(capsys, monkeypatch):
    not_built = {"threads": 1, "torch": TORCH, "deepspeed": None}
    monkeypatch.setattr(_machine_rates, "_RATES", {"host-adam-1.json": not_built})
    host = estimate(capsys, "--host-cores", "16")["speed"]["host"]
    assert host["torch_adam_per_core"] == TORCH and host["cpu_adam_per_core"] > TORCH
    assert "not timed" in host["source"]


def test_the_training_machine_times_the_cores_one_rank_gets_and_prices_its_own(monkeypatch):
    asked = []
    monkeypatch.setattr(_machine_rates, "first_gpu", lambda: GpuInfo("NVIDIA A100-SXM4-80GB", 81920 * 2**20))
    monkeypatch.setattr(_machine_rates, "_cores", lambda: 16)
    monkeypatch.setattr(_machine_rates, "host_adam_rates", lambda threads: asked.append(threads) or
                        {"torch": TORCH, "deepspeed": CPU_ADAM, "bandwidth": 50e9})
    spec = SimpleNamespace(device="cuda", ranks=4, options=SimpleNamespace(host_cores=None))
    card = host_card(CARDS["A100-80GB"], spec)
    assert asked == [4] and card.host_cores == 16  # 16 cores over 4 ranks: each rank's AdamW on 4 threads
    assert card.host_bandwidth == 50e9  # this machine's memory, measured
    other = host_card(CARDS["H100"], spec)  # planning for a card that is not this machine's
    assert asked == [4, 1] and other.host_cores == 0 and other.host_bandwidth == 0


def test_a_bad_host_cores_is_refused_in_one_line(capsys):
    assert cli.main(["estimate", *LLAMA_8B, "--host-cores", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--host-cores" in err and "0" in err, err
