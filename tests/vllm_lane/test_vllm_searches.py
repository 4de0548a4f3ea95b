"""The vLLM lane (issue 46; ``make test-vllm``, its own environment: vLLM's CPU build, the transformers it pins): GRPO
and RLOO searches whose probes generate with real vLLM, colocated in the probe's process and served beside it by
``trl vllm-serve``; best.json records vLLM's share as the ledger predicts it beside what the probes measured, and
best.yaml, vLLM's settings included, is a file ``trl grpo --config`` reads. Skipped where vLLM is not installed (the
main lane); the rungs themselves are tested there (tests/rungs/test_vllm_rungs.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: make test-vllm runs these in its own environment")

from autofit.launch import read_trl_file  # noqa: E402 - after the skip

SMALL = ["--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "2GiB", "--max-completion-length", "16",
         "--max-prompt-length", "8", "--effective-batch", "4", "--num-generations", "2", "--verify-steps", "2"]


def _search(out: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "autofit.cli", "search", *SMALL, *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "best.json").read_text())


def _vllm_processes() -> list:
    """vLLM's processes still running (the server's, its engine core and worker), by their command lines."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            line = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.isdigit() and ("vllm.entrypoints" in line or "VLLM::" in line):
            found.append(line)
    return found


def test_a_grpo_search_probes_vllm_colocated_and_its_settings(tmp_path):
    """At 90% of a 400 MiB card vLLM leaves the trainer too little: the probes of the first levels run out of memory,
    and the vllm-share level gives vLLM what it needs (the ledger's figure), the trainer the rest."""
    best = _search(tmp_path, "--algo", "grpo", "--use-vllm", "colocate", "--ladder", "vllm-context,vllm-share",
                   "--gpu-memory", "400MiB", "--vllm-gpu-memory-utilization", "0.9", "--no-predict")
    vllm = best["vllm"]
    assert vllm["mode"] == "colocate" and vllm["probed"]
    measured, predicted = vllm["measured"], vllm["predicted"]
    assert measured["kv_cache_bytes"] == 2**30  # the CPU build's VLLM_CPU_KVCACHE_SPACE, in host memory
    assert measured["generation_peak_bytes"] >= measured["kv_cache_bytes"] and measured["kv_tokens"] > 0
    assert measured["weight_sync"] == "reload_weights (the CPU build)"
    assert predicted["weights_bytes"] > 0 and predicted["starts"]
    outcomes = {tuple(c["rungs"]): c["outcome"] for c in best["candidates"] if c["kind"] == "probe"}
    assert outcomes[()] == "OOM" and outcomes[("vllm-context",)] == "OOM"
    assert best["rungs"][-1] == "vllm-share" and vllm["utilization"] < 0.9
    assert all(peak >= vllm["share_bytes"] for peak in best["phase_peaks"].values())  # its share in every phase
    # best.yaml is TRL's: vLLM's settings as the probes ran them
    training = read_trl_file(str(tmp_path / "best.yaml"), "grpo").training
    assert training["use_vllm"] is True and training["vllm_mode"] == "colocate"
    assert training["vllm_gpu_memory_utilization"] == vllm["utilization"]
    if "vllm-context" in best["rungs"]:
        assert training["vllm_max_model_length"] == 24 == measured["max_model_len"]  # prompt 8 + completion 16
    # vLLM's own start-up lines, kept in the probes' logs (issue 61, item 6): its KV cache and maximum concurrency
    logs = [path.read_text(errors="replace") for path in tmp_path.glob("probes/**/probe.log")]
    started = [text for text in logs if "Maximum concurrency for" in text]
    sized = [text for text in started if re.search(r"KV cache size: [\d,]+ tokens", text)]
    assert started and sized == started, "\n".join(logs)[-3000:]


def test_an_rloo_search_probes_vllm_colocated(tmp_path):
    best = _search(tmp_path, "--algo", "rloo", "--use-vllm", "colocate", "--ladder", "micro-batch")
    assert best["vllm"]["probed"] and best["vllm"]["measured"]["generation_peak_bytes"] > 0
    assert best["verified"]["stats"]["vllm"] == "colocate" and best["generation_tokens_per_second"]


def test_a_grpo_search_probes_vllm_served_and_stops_every_process_it_started(tmp_path):
    before = _vllm_processes()
    best = _search(tmp_path, "--algo", "grpo", "--use-vllm", "server", "--ladder", "micro-batch")
    assert best["vllm"]["probed"] and best["vllm"]["mode"] == "server"
    assert best["vllm"]["measured"]["weight_sync"] == "left out: NCCL needs a CUDA device"
    assert best["vllm"]["measured"]["server_start_seconds"] > 0
    text = (tmp_path / "best.yaml").read_text()
    assert "# vLLM server mode: start it first, trl vllm-serve --model " in text
    assert read_trl_file(str(tmp_path / "best.yaml"), "grpo").training["vllm_mode"] == "server"
    assert _vllm_processes() == before  # the servers of both probes, their engine cores and workers: gone
