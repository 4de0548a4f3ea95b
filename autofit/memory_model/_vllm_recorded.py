"""vLLM's own start-up log lines, as published, and the figures of its GPU-side accounting the ledger takes from them.

The CPU build of vLLM has no CUDA graphs and no non-torch memory, and no vLLM runs on a GPU here, so these terms of
vLLM's share (``autofit.memory_model._vllm``) come from what vLLM logged on real cards: each record is the lines as a
public issue quotes them, with where it was found. ``parse_log`` reads them the way a user reads their own log, and
the constants below are drawn from the records, not typed beside them: this module is the one place a recorded
figure lives. A user's own log (``parse_log`` of it) can be checked against the ledger the same way the tests do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Tuple

GIB, MIB = 2**30, 2**20

# What each figure is called in vLLM's log, and the line that gives it [S: vllm/v1/worker/gpu_worker.py,
# Worker.determine_available_memory and compile_or_warm_up_model; vllm/v1/worker/gpu_model_runner.py, load_model,
# profile_cudagraph_memory and capture_model; vllm/worker/worker.py, determine_num_available_blocks (0.6-0.8's
# "model weights take ..." summary)].
_PATTERNS: Dict[str, str] = {
    "weights": r"Model loading took ([\d.]+) GiB|model weights take ([\d.]+)\s*GiB",
    "non_torch": r"non_torch_memory takes ([\d.]+)\s*GiB",
    "activation_peak": r"PyTorch activation peak memory takes ([\d.]+)\s*GiB",
    "kv_cache": r"Available KV cache memory: ([\d.]+) GiB|reserved for KV Cache is ([\d.]+)\s*GiB",
    "graphs_estimated": r"Estimated CUDA graph memory: ([\d.]+) GiB",
    "graphs_captured": r"Graph capturing finished in \d+ secs?, took ([\d.]+) GiB",
    "graphs_actual": r"CUDA graph pool memory: (-?[\d.]+) GiB \(actual\)",
    "total": r"total_gpu_memory \(([\d.]+)\s*GiB\)",
    "requested": r"gpu_memory_utilization \([\d.]+\) = ([\d.]+)\s*GiB",
    "utilization": r"--gpu-memory-utilization=([\d.]+) is equivalent|gpu_memory_utilization \(([\d.]+)\) =",
    "equivalent_utilization": r"is equivalent to --gpu-memory-utilization=([\d.]+)",
    "max_model_len": r"Maximum concurrency for ([\d,]+) tokens per request",
}
_GRAPHS = re.compile(r"Profiling CUDA graph memory: PIECEWISE=(\d+) \(largest=\d+\)(?:, FULL=(\d+))?")


def parse_log(text: str) -> Dict[str, float]:
    """The figures a vLLM start-up log gives (GiB where a size; the first of each), and ``graphs``: the number of
    graphs its profiler captured (PIECEWISE + FULL)."""
    found: Dict[str, float] = {}
    for name, pattern in _PATTERNS.items():
        match = re.search(pattern, text)
        if match:
            found[name] = float(next(group for group in match.groups() if group is not None).replace(",", ""))
    graphs = _GRAPHS.search(text)
    if graphs:
        found["graphs"] = float(int(graphs.group(1)) + int(graphs.group(2) or 0))
    return found


@dataclass(frozen=True)
class LogRecord:
    """One published vLLM start-up: where it was found, what ran, and its log lines as quoted there."""

    source: str
    version: str
    setting: str  # model, card, parallelism, as the source states them
    log: str
    figures: Dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "figures", parse_log(self.log))


RECORDS: Tuple[LogRecord, ...] = (
    LogRecord("vllm-project/vllm#11251", "0.6.4.post1", "7B-class model, one 16 GB card (15.77 GiB), TP 1",
              "the current vLLM instance can use total_gpu_memory (15.77GiB) x gpu_memory_utilization (0.90) = "
              "14.20GiB\nmodel weights take 7.51GiB; non_torch_memory takes 0.39GiB; PyTorch activation peak memory "
              "takes 2.53GiB; the rest of the memory reserved for KV Cache is 3.76GiB."),
    LogRecord("vllm-project/vllm#15815", "0.8", "Qwen2.5-32B-Instruct, 2 x L40S (44.42 GiB), TP 2",
              "the current vLLM instance can use total_gpu_memory (44.42GiB) x gpu_memory_utilization (0.90) = "
              "39.98GiB\nmodel weights take 30.71GiB; non_torch_memory takes 0.30GiB; PyTorch activation peak memory "
              "takes 1.26GiB; the rest of the memory reserved for KV Cache is 7.71GiB.\n"
              "# CUDA blocks: 3947, # CPU blocks: 2048\nMaximum concurrency for 10000 tokens per request"),
    LogRecord("vllm-project/vllm#14452", "0.8", "RTX 5090 (31.37 GiB), one of several workers",
              "the current vLLM instance can use total_gpu_memory (31.37GiB) x gpu_memory_utilization (0.85) = "
              "26.66GiB\nmodel weights take 10.30GiB; non_torch_memory takes 0.33GiB; PyTorch activation peak memory "
              "takes 1.77GiB; the rest of the memory reserved for KV Cache is 14.26GiB."),
    LogRecord("gpustack/runner#251", "0.27.1", "24 GB card, TP 2",
              "Profiling CUDA graph memory: PIECEWISE=16 (largest=16)\n"
              "Estimated CUDA graph memory: 0.36 GiB total\nAvailable KV cache memory: 6.87 GiB\n"
              "CUDA graph memory profiling is enabled (default since v0.21.0). The current "
              "--gpu-memory-utilization=0.8200 is equivalent to --gpu-memory-utilization=0.8048 without CUDA graph "
              "memory profiling."),
    LogRecord("vllm-project/vllm#48214", "0.2x (2026-07)", "dense model, one GPU, max_num_seqs 256",
              "Profiling CUDA graph memory: PIECEWISE=51 (largest=512)\n"
              "Estimated CUDA graph memory: 0.44 GiB total\nAvailable KV cache memory: 37.99 GiB\n"
              "The current --gpu-memory-utilization=0.9000 is equivalent to --gpu-memory-utilization=0.8901 without "
              "CUDA graph memory profiling."),
    LogRecord("vllm-project/vllm#39559", "0.18", "Qwen3.5 GGUF, one GPU, max_num_seqs 256",
              "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35 (largest=256)\n"
              "Estimated CUDA graph memory: 1.62 GiB total\nAvailable KV cache memory: 6.9 GiB"),
    LogRecord("noonghunna/club-3090#434", "0.2x (2026-06)", "Qwen 27B, 2 x RTX 3090, TP 2, max_num_seqs 8",
              "Profiling CUDA graph memory: PIECEWISE=3 (largest=16), FULL=2 (largest=8)\n"
              "Estimated CUDA graph memory: 0.09 GiB total\nAvailable KV cache memory: 5.0 GiB\n"
              "The current --gpu-memory-utilization=0.9200 is equivalent to --gpu-memory-utilization=0.9160 without "
              "CUDA graph memory profiling."),
)


def _most(name: str, per_graph: bool = False) -> float:
    values = [record.figures[name] / (record.figures["graphs"] if per_graph else 1.0) for record in RECORDS
              if name in record.figures and (not per_graph or "graphs" in record.figures)]
    return max(values) * GIB


# The memory vLLM allocates outside PyTorch after its start snapshot (cuBLAS/cuDNN workspaces, NCCL's buffers of its
# own groups): "non_torch_memory takes" 0.30-0.39 GiB in the records; the most of them.
NON_TORCH_BYTES = _most("non_torch")
# One captured graph (PIECEWISE or FULL) as vLLM's profiler estimates it, the most per graph among the records
# (0.09 GiB for 5 graphs, 0.36 for 16, 1.62 for 86, 0.44 for 51: 8.8-23 MiB a graph). Real pools are often smaller
# (graphs share one pool: vllm-project/vllm#45178) and sometimes larger (#57475): the band below holds the difference.
GRAPH_BYTES_PER_CAPTURE = _most("graphs_estimated", per_graph=True)
# What vLLM spends beyond its share that its own accounting misses, the low and high end: vLLM's own 150 MiB
# "redundancy_buffer_memory" ("empirically observed that the memory profiling may slightly underestimate the memory
# consumption", [S: vllm/v1/worker/gpu_worker.py, Worker.compile_or_warm_up_model], never subtracted: #37419), and
# 512 MiB: the real graph capture after the KV cache is allocated needing more than the estimate (#57475: a 24 GB card
# at 0.98 failed with 121 MiB free asking 136 MiB, started at 0.97; about 0.46 GiB above the share there, the CUDA
# context of that process included, which the trainer's ledger counts already here).
UNMODELLED_BAND = (150 * MIB, 512 * MIB)
