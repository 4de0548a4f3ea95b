"""The engines' probe step (optimizer offload, the shardings, data parallel across ranks), run in the probe's child
process: their files and launch environment before the trainer is built, FSDP2 across the simulated device's ranks
around it (``autofit.rungs.engines._probe_fsdp``), and what an offloading engine keeps in host memory, read back.

DeepSpeed ZeRO-1/2 with ``offload_optimizer`` keeps the fp32 master partition, its gradient, the CPU Adam states,
a pinned copy of the weights in the device dtype (the updated weights on their way back), a pinned staging buffer
of the largest parameter's gradient and (with gradient accumulation) an fp32 accumulation buffer per parameter in
host memory. On a GPU they are not device memory by construction; the CPU's simulated meter cannot tell them apart
by device, so it is told which storages they are (``SimulatedMeter.set_host``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, ContextManager, Dict, List, Optional, Tuple

from autofit.core import INFRASTRUCTURE, USER, Candidate, FactoryMisuse, Outcome
from autofit.rungs._contract import ProbeStep
from autofit.rungs._failures import ENGINE_FAILURE
from autofit.rungs.engines import _probe_fsdp as simulated_fsdp
from autofit.rungs.engines._files import FSDP_ENGINES, launch_env, process_env, write_engine_files


class EngineStep(ProbeStep):
    """An engine (optimizer offload, a sharding, data parallel across ranks): its files and launch environment before
    the trainer is built, FSDP2 across the simulated device's ranks around it, the state it offloads read back. A
    crash under it is the rung's (like a config TRL rejects), not the search's."""

    stage = "load"  # the engine's failures belong to the rung, not to the machine

    def active(self, candidate: Candidate) -> bool:
        return bool(candidate.engine)

    def keeps_host(self, candidate: Candidate) -> bool:
        return candidate.optimizer_offload  # its offloaded optimizer's states (the shardings' offload: GPUs only)

    def before_build(self, candidate: Candidate) -> None:
        enter_engine(candidate)

    def around(self, candidate: Candidate, meter: Any) -> ContextManager[Any]:
        if candidate.device == "cpu" and candidate.engine in FSDP_ENGINES:
            return simulated_fsdp.instrumented(meter)
        return contextlib.nullcontext()

    def read_back(self, trainer: Any, candidate: Candidate, meter: Any, handle: Any,
                  observed: Dict[str, Any]) -> Dict[str, Any]:
        return {"host_bytes": offloaded_state(trainer, candidate, meter)} if candidate.optimizer_offload else {}

    def failure(self, candidate: Candidate, outcome: Outcome, fault: str, cause: str) -> Optional[Tuple[Outcome, str]]:
        if outcome is Outcome.CRASH and fault not in (USER, INFRASTRUCTURE):
            return Outcome.INVALID, ENGINE_FAILURE
        return None


def enter_engine(candidate: Candidate) -> None:
    """Write the engine's files (as the export will) and take the environment ``accelerate launch`` would give."""
    assert candidate.engine is not None  # entered only for a candidate with an engine
    folder = Path(candidate.probe.output_dir) / "engine" if candidate.probe else Path(tempfile.mkdtemp())
    files = write_engine_files(folder, candidate.engine, candidate.device, candidate.ranks)
    os.environ.update(launch_env(files["accelerate"], candidate.device, candidate.engine))


class OwnDeepSpeedStep(ProbeStep):
    """No rung's: the user's own DeepSpeed run (``deepspeed:`` in their config), launched as TRL's CLI would."""

    def active(self, candidate: Candidate) -> bool:
        return not candidate.engine and bool(dict(candidate.user_args).get("deepspeed"))

    def before_build(self, candidate: Candidate) -> None:
        os.environ.update(process_env(candidate.device))


def zero_optimizer(trainer):
    """The DeepSpeed ZeRO optimizer behind the trainer's (accelerate-wrapped) optimizer, or None."""
    optimizer = getattr(trainer, "optimizer", None)
    inner = getattr(optimizer, "optimizer", None)
    for candidate in (inner, optimizer):
        if candidate is not None and hasattr(candidate, "single_partition_of_fp32_groups"):
            return candidate
    return None


def host_tensors(trainer) -> List:
    """Every tensor the engine holds in host memory (empty when nothing is offloaded)."""
    import torch

    zero = zero_optimizer(trainer)
    if zero is None or not getattr(zero, "cpu_offload", False):
        return []
    found = []
    for master in zero.single_partition_of_fp32_groups:
        found.append(master)
        if master.grad is not None:
            found.append(master.grad)
    for state in getattr(zero.optimizer, "state", {}).values():
        found.extend(value for value in state.values() if isinstance(value, torch.Tensor))
    staging = getattr(zero, "temp_grad_buffer_for_cpu_offload", None)  # the largest parameter's gradient, pinned
    if isinstance(staging, torch.Tensor):
        found.append(staging)
    # the updated weights in the device dtype, pinned, before they are copied back to the device
    found.extend(getattr(zero, "param_buffer_of_bit16_for_cpu_offload_groups", None) or [])
    accumulated = getattr(zero, "accumulated_grads_in_cpu", None) or {}
    found.extend(value for value in accumulated.values() if isinstance(value, torch.Tensor))
    return found


def host_bytes(trainer) -> int:
    seen, total = set(), 0
    for tensor in host_tensors(trainer):
        storage = tensor.untyped_storage()
        if storage._cdata not in seen:
            seen.add(storage._cdata)
            total += storage.nbytes()
    return total


def offloaded_state(trainer, candidate: Candidate, meter) -> int:
    """Bytes the engine holds in host memory; on the simulated meter they leave the device's peaks, and its budget
    is checked now. A trainer that did not run under the engine measured something else: an error, not a fit."""
    tensors = host_tensors(trainer)
    if not tensors:
        raise FactoryMisuse(
            f"the candidate offloads the optimizer ({candidate.engine}) but the trainer did not run DeepSpeed's "
            "ZeRO optimizer with offload_optimizer: build the trainer's config from candidate.training_args() "
            "inside the factory, so it sees the engine's launch environment"
        )
    if hasattr(meter, "set_host"):
        meter.set_host(tensors)
        meter.check_budget()
    return host_bytes(trainer)
