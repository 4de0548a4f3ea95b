"""This host's AdamW rate, for the optimizer step an offloading engine runs on the CPU (issue 60, item 3): torch's
AdamW (FSDP2's CPU offload steps with it) over a few million float32 parameters on the threads one rank gets, in
parameters a second per thread, and the bandwidth of a copy on every core (what all the ranks' steps share). A
child-side module: the search, which never imports torch, runs it as ``python -m autofit.probe._host_adam THREADS``
and reads the JSON line it prints.

DeepSpeed's CPUAdam (ZeRO-Offload's) is not timed: loading it goes through torch's extension build, which takes
minutes where it is not built (133 s here), rebuilds for another environment's paths and waits on the build
folder's lock, which a killed build leaves behind (seen: a child that never returned). Its rate is torch's measured
one at the assumed ratio (``memory_model._host_time``), said where it is priced; "deepspeed" is null.
"""

from __future__ import annotations

import json
import sys
from typing import Callable

from autofit.probe._rates import best_seconds

PARAMETERS = 16_000_000  # 64 MB an fp32 copy: the four (weights, gradients, moments) past the caches
TENSORS = 4  # a rank's shard is many tensors; four keep torch's per-tensor loop in the timing
REPEATS = 3


def _warm_best(step: Callable[[], object]) -> float:
    step()  # the first step allocates the moments
    return best_seconds(step, REPEATS)


def _copy_bandwidth(torch) -> float:
    source = torch.rand(PARAMETERS)
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / _warm_best(lambda: target.copy_(source))


def measure(threads: int) -> dict:
    """Parameters a second per thread of torch's AdamW and (where built) DeepSpeed's CPUAdam on ``threads`` threads,
    and the host memory's bytes a second (read and written) on all of them."""
    import os

    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    bandwidth = _copy_bandwidth(torch)  # on every core: the node's
    torch.set_num_threads(threads)
    params = [torch.nn.Parameter(torch.rand(PARAMETERS // TENSORS)) for _ in range(TENSORS)]
    for param in params:
        param.grad = torch.rand_like(param)
    torch_adam = torch.optim.AdamW(params, lr=1e-4)
    rates: dict = {"threads": threads, "bandwidth": bandwidth,
                   "torch": PARAMETERS / _warm_best(torch_adam.step) / threads}
    rates["deepspeed"] = None  # not timed: see the module's docstring
    return rates


if __name__ == "__main__":
    print(json.dumps(measure(max(1, int(sys.argv[1]) if len(sys.argv) > 1 else 1))))
