"""This host's AdamW rate, for the optimizer step an offloading engine runs on the CPU (issue 60, item 3): torch's
AdamW (FSDP2's CPU offload steps with it) and DeepSpeed's CPUAdam (ZeRO-Offload's) over a few million float32
parameters on the threads one rank gets, in parameters a second per thread, and the bandwidth of a copy on every
core (what all the ranks' steps share). A child-side module: the search, which never imports torch, runs it as
``python -m autofit.probe._host_adam THREADS`` and reads the JSON line it prints.

DeepSpeed's CPUAdam is timed only where its extension is already built (prebuilt, or JIT-built by an earlier run):
building it takes minutes (133 s on this project's two cores), which no estimate waits for; its rate is then null.
"""

from __future__ import annotations

import json
import sys
from typing import Callable, Optional

from autofit.probe._rates import best_seconds

PARAMETERS = 16_000_000  # 64 MB an fp32 copy: the four (weights, gradients, moments) past the caches
TENSORS = 4  # a rank's shard is many tensors; four keep torch's per-tensor loop in the timing
REPEATS = 3


def _warm_best(step: Callable[[], object]) -> float:
    step()  # the first step allocates the moments
    return best_seconds(step, REPEATS)


def _cpu_adam_built() -> bool:
    """Whether DeepSpeed's CPUAdam loads without a build: installed prebuilt, or its JIT build kept by torch."""
    try:
        from deepspeed.git_version_info import installed_ops
        from torch.utils.cpp_extension import _get_build_directory
    except Exception:  # noqa: BLE001 - no DeepSpeed, or one that names its ops elsewhere
        return False
    if installed_ops.get("cpu_adam"):
        return True
    import pathlib

    return any(pathlib.Path(_get_build_directory("cpu_adam", False)).glob("cpu_adam*.so"))


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
    deepspeed: Optional[float] = None
    if _cpu_adam_built():
        try:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            deepspeed = PARAMETERS / _warm_best(DeepSpeedCPUAdam(params, lr=1e-4).step) / threads
        except Exception as exc:  # noqa: BLE001 - a kept build of another torch: not timed, said on stderr
            print(f"DeepSpeed's CPUAdam not timed: {type(exc).__name__}: {exc}", file=sys.stderr)
    rates["deepspeed"] = deepspeed
    return rates


if __name__ == "__main__":
    print(json.dumps(measure(max(1, int(sys.argv[1]) if len(sys.argv) > 1 else 1))))
