"""This machine's own rates for the throughput model on the CPU meter: the FLOP rate of a float32 matmul, the rows
at which a matmul reaches half of it, the bandwidth of a copy larger than the caches and the time of one operator
dispatched under the probe's simulated meter, measured with torch (``memory_model.measured_rates_card`` makes them a
card). A child-side module: the search, which never imports torch, runs it as ``python -m autofit.probe._rates``,
which prints them as one JSON line."""

from __future__ import annotations

import json
import time
from typing import Callable, Tuple

from autofit.machine import RATE_NAMES


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


SMALL_ROWS = 32  # the few-row matmul that places the half-rate point
BLOCKS = 20  # tiny residual blocks (norm, linear, SiLU) whose forward and backward time one operator in a model
WARM_UPS, REPEATS = 3, 7  # for the operator's and the passes' timings, which spread by half on a first run
TILE_ROWS, TILE_COLUMNS, TILE_PASSES = 512, 8192, 5  # a logits tile, and the passes ``_elementwise_seconds`` makes


def measure_rates(n: int = 1024, copy_mib: int = 64) -> Tuple[float, float, float, float, float]:
    """(FLOP/s of an n x n float32 matmul, bytes/s of a ``copy_mib`` MiB copy, seconds per operator of a model under
    the simulated meter, rows at half the matmul rate, seconds per element of an fp32 pass: ``RATE_NAMES``),
    the best of three runs each (a busy machine only slows a run down), with as many threads as torch gives a
    probe."""
    import torch

    from autofit.probe._meters import SimulatedMeter

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    flops = 2 * n**3 * 10 / best_seconds(lambda: [a @ b for _ in range(10)], 3)
    few = a[:SMALL_ROWS].clone()
    small = 2 * SMALL_ROWS * n * n * 50 / best_seconds(lambda: [few @ b for _ in range(50)], 3)
    source = torch.empty(copy_mib * 2**20 // 4)
    target = torch.empty_like(source)
    target.copy_(source)
    bandwidth = 2 * source.numel() * 4 * 5 / best_seconds(lambda: [target.copy_(source) for _ in range(5)], 3)
    op_seconds = _operator_seconds(torch, SimulatedMeter)
    return flops, bandwidth, op_seconds, half_rate_rows(small / flops, n), _elementwise_seconds(torch)


def _operator_seconds(torch, meter_class) -> float:
    """One operator of a model's forward and backward under the simulated meter: modules' calls, autograd's nodes
    and the meter's bookkeeping, on tensors too small for their arithmetic to count."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.linear = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)

        def forward(self, x):
            return x + torch.nn.functional.silu(self.linear(self.norm(x)))

    net, x = torch.nn.Sequential(*[Block() for _ in range(BLOCKS)]), torch.randn(4, 8)

    class Count(TorchDispatchMode):
        operators = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.operators += 1
            return func(*args, **(kwargs or {}))

    with Count():
        net(x).sum().backward()
    with meter_class():
        for _ in range(WARM_UPS):
            net(x).sum().backward()
        return best_seconds(lambda: net(x).sum().backward(), REPEATS) / max(Count.operators, 1)


def _elementwise_seconds(torch) -> float:
    """Seconds per element of one whole-tensor fp32 pass over a logits-sized tile: the mean of the passes TRL's fused
    head's torch fallback is made of (a scale, a broadcast subtraction, exp, a comparison, a product and its sum).
    Timed directly rather than as the kernel's time less its matmuls, a difference that spread by 2x run to run."""
    tile = torch.randn(TILE_ROWS, TILE_COLUMNS)
    row, index = torch.randn(TILE_ROWS, 1), torch.randint(0, TILE_COLUMNS, (TILE_ROWS,))
    columns = torch.arange(TILE_COLUMNS)

    def passes() -> None:
        scaled, exp = tile * 1.5, torch.exp(tile - row)
        _ = columns < index.unsqueeze(-1)
        (scaled * exp).sum(-1)

    for _ in range(WARM_UPS):  # the first runs also fault in the tiles' pages
        passes()
    return best_seconds(passes, REPEATS) / (TILE_PASSES * TILE_ROWS * TILE_COLUMNS)


def half_rate_rows(ratio: float, rows: int) -> float:
    """The rows h at which rate(r) = peak·r/(r + h) is half the peak, from the rate at ``SMALL_ROWS`` over the rate
    at ``rows``; bounded to [1, 4096] where noise puts the ratio out of reach."""
    ratio = min(max(ratio, 1.5 * SMALL_ROWS / rows), 0.999)
    return min(max(rows * SMALL_ROWS * (1 - ratio) / (rows * ratio - SMALL_ROWS), 1.0), 4096.0)


if __name__ == "__main__":
    print(json.dumps(dict(zip(RATE_NAMES, measure_rates(), strict=True))))
