"""This machine's own rates for the throughput model on the CPU meter: the FLOP rate of a float32 matmul and the
bandwidth of a copy larger than the caches, measured with torch (``memory_model.measured_rates_card`` makes them a
card). A child-side module: the search, which never imports torch, runs it as ``python -m autofit.probe._rates``,
which prints them as one JSON line."""

from __future__ import annotations

import json
import time
from typing import Callable, Tuple


def _best_seconds(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure_rates(n: int = 1024, copy_mib: int = 64) -> Tuple[float, float]:
    """(FLOP/s of an n x n float32 matmul, bytes/s of a ``copy_mib`` MiB copy), the best of three runs each (a busy
    machine only slows a run down), with as many threads as torch gives a probe."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    flops = 2 * n**3 * 10 / _best_seconds(lambda: [a @ b for _ in range(10)], 3)
    source = torch.empty(copy_mib * 2**20 // 4)
    target = torch.empty_like(source)
    target.copy_(source)
    bandwidth = 2 * source.numel() * 4 * 5 / _best_seconds(lambda: [target.copy_(source) for _ in range(5)], 3)
    return flops, bandwidth


if __name__ == "__main__":
    flops, bandwidth = measure_rates()
    print(json.dumps({"flops": flops, "bandwidth": bandwidth}))
