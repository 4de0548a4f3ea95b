"""The engines' own settings behind the ledger's sharding terms: DeepSpeed ZeRO's buckets and live parameters, and
what NCCL holds outside PyTorch's allocator.

A ZeRO configuration comes from the user's config file (the training argument ``deepspeed``: a dict, or a JSON
file's path) or else from the sharding rung autofit writes (``autofit.rungs.deepspeed_config``). It is read the way
the Trainer hands it to DeepSpeed: an "auto" value is the Trainer's (``reduce_bucket_size`` hidden², the ZeRO-3
prefetch bucket 0.9·hidden²), a key left out is DeepSpeed's own default (5e8-element reduce bucket, 5e7 prefetch
bucket, 1e9 live parameters; ``overlap_comm`` on for ZeRO-3 only). ZeRO-1/2 hold a second reduce bucket with
``overlap_comm``; ZeRO-3 holds one whatever ``overlap_comm`` says [D: DeepSpeed 0.19 ``runtime/zero/config.py``,
``stage_1_and_2.py`` ``setup_buckets``, ``stage3.py`` ``_setup_for_real_optimizer``; transformers'
``integrations/deepspeed.py`` ``trainer_config_finalize``]. Where the buckets live, phase by phase, is
``_sharding.zero_phase_buffers``; DeepSpeed before 0.17.2 allocated ZeRO-1/2's before the loss's backward
(``buckets_before_backward``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Dict, NamedTuple, Optional

from autofit.core import ENGINES, Candidate, engine_for, engine_of
from autofit.memory_model._shape import ModelShape

# DeepSpeed's defaults for the keys a configuration leaves out [D: DeepSpeed 0.19 runtime/zero/config.py]
REDUCE_BUCKET_DEFAULT = 5e8
PREFETCH_BUCKET_DEFAULT = 5e7
MAX_LIVE_DEFAULT = 1e9
# The Trainer's "auto" [D: transformers integrations/deepspeed.py]
AUTO_PREFETCH_H2 = 0.9
# NCCL's buffers on each GPU, outside PyTorch's allocator (nvidia-smi shows them, max_memory_allocated does not):
# about 1 GB per communicator on 8 x H100 over NVLink after its first collectives (NVIDIA/nccl#1685: "NV 1.06 GB"
# excluding PyTorch), linear in its channels (NVIDIA/nccl#986). One communicator: the data-parallel group [M].
NCCL_BYTES_PER_GPU = 1.0e9
# The first DeepSpeed whose ZeRO-1/2 allocate their reduce buckets at the first gradient of the backward (its
# gradient hook's ``backward_prologue``, ``setup_buckets`` from 0.18.3) rather than in ``backward()`` before the
# loss's backward [D: DeepSpeed v0.17.1 against v0.17.2 ``stage_1_and_2.py``]
LAZY_BUCKETS_SINCE = (0, 17, 2)


@dataclass(frozen=True)
class ZeroSettings:
    """A ZeRO stage's buffers in elements: the gradient reduce buckets (ZeRO-1/2: two with ``overlap_comm``), ZeRO-3's
    prefetch bucket and its cap on gathered parameters."""

    stage: int
    reduce_bucket: float
    reduce_buckets: int
    prefetch_bucket: float
    max_live: float


def user_deepspeed(candidate: Candidate) -> Optional[Dict[str, Any]]:
    """The DeepSpeed configuration the user's file gives (the ``deepspeed`` training argument), read; None when it
    gives none or it cannot be read (then it is not modelled: ``unmodelled_deepspeed``)."""
    return read_deepspeed(dict(candidate.user_args).get("deepspeed"))


def read_deepspeed(given: Any) -> Optional[Dict[str, Any]]:
    """A ``deepspeed`` training argument's configuration: the dict itself, or the JSON file it names."""
    if isinstance(given, dict):
        return given
    if isinstance(given, str) and given:
        try:
            loaded = json.loads(Path(given).read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        return loaded if isinstance(loaded, dict) else None
    return None


def _number(value: Any, auto: float, default: float) -> float:
    if value == "auto":
        return auto
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return default


def _zero_section(config: Dict[str, Any]) -> Dict[str, Any]:
    section = config.get("zero_optimization")
    return section if isinstance(section, dict) else {}


def _offloads(zero: Dict[str, Any]) -> bool:
    return any(isinstance(zero.get(k), dict) and zero[k].get("device") not in (None, "none")
               for k in ("offload_optimizer", "offload_param"))


def user_zero_stage(candidate: Candidate) -> Optional[int]:
    """The ZeRO stage of the user's own DeepSpeed configuration (1-3), or None."""
    config = user_deepspeed(candidate)
    stage = _zero_section(config).get("stage") if config else None
    return stage if stage in (1, 2, 3) else None


def zero_engine(candidate: Candidate) -> Optional[str]:
    """The ZeRO engine the candidate trains under: its sharding rung, else the user's own configuration's stage."""
    sharding = engine_of(candidate.sharding)
    if sharding is not None and sharding.deepspeed and sharding.sharding:
        return sharding.name
    if candidate.sharding is None and not candidate.optimizer_offload:
        stage = user_zero_stage(candidate)
        return engine_for(stage) if stage else None
    return None


def shards_parameters(engine: Optional[str]) -> bool:
    """Whether ``engine`` shards the parameters, each module's gathered for its pass (ZeRO-3, FSDP2, their offloads)."""
    found = engine_of(engine)
    return found is not None and found.shards_parameters


def hooks_every_module(engine: Optional[str]) -> bool:
    """Whether ``engine`` is DeepSpeed's ZeRO-3 (or its offload), whose Python hooks on every submodule fetch and
    release its parameters on the host (``_dispatch.OPS_ZERO3_*``); FSDP2 hooks only its wrapped layers."""
    found = engine_of(engine)
    return found is not None and found.deepspeed and found.shards_parameters


def zero_settings(candidate: Candidate, shape: ModelShape) -> ZeroSettings:
    """The buffers of the candidate's ZeRO engine, from the configuration it runs with."""
    from autofit.rungs import deepspeed_config

    engine = zero_engine(candidate) or engine_for(2)
    user = user_deepspeed(candidate)
    zero = _zero_section(user if user is not None and candidate.sharding is None else deepspeed_config("cuda", engine))
    written = zero.get("stage")
    stage = int(written) if written in (1, 2, 3) else ENGINES[engine].stage
    h2 = float(shape.hidden) ** 2
    overlap = zero.get("overlap_comm")
    overlap = stage == 3 if overlap in (None, "auto") else bool(overlap)
    # DeepSpeed turns contiguous gradients on for an offloaded optimizer whatever the key says
    contiguous = zero.get("contiguous_gradients", True) is not False or bool(_offload_device(zero, "offload_optimizer"))
    return ZeroSettings(
        stage=stage,
        reduce_bucket=_number(zero.get("reduce_bucket_size"), h2, REDUCE_BUCKET_DEFAULT),
        reduce_buckets=2 if overlap and contiguous and stage < 3 else 1,
        prefetch_bucket=_number(zero.get("stage3_prefetch_bucket_size"), AUTO_PREFETCH_H2 * h2,
                                PREFETCH_BUCKET_DEFAULT),
        max_live=_number(zero.get("stage3_max_live_parameters"), MAX_LIVE_DEFAULT, MAX_LIVE_DEFAULT))


def buckets_before_backward() -> bool:
    """Whether the installed DeepSpeed allocates ZeRO-1/2's reduce buckets before the loss's backward (before 0.17.2),
    so that they sit beside the LM head's backward; without DeepSpeed (a planning machine) the current releases'
    way, at the first gradient."""
    try:
        installed = version("deepspeed")
    except PackageNotFoundError:
        return False
    numbers = tuple(int(part) for part in re.findall(r"\d+", installed.split("+")[0])[:3])
    return numbers < LAZY_BUCKETS_SINCE


def _offload_device(zero: Dict[str, Any], key: str) -> Optional[str]:
    section = zero.get(key)
    device = section.get("device") if isinstance(section, dict) else None
    return device if device not in (None, "none") else None


def user_offload_engine(config: Optional[Dict[str, Any]]) -> Optional[str]:
    """The engine our ledger models for a user's DeepSpeed configuration that offloads to the CPU: ZeRO-1/2 with
    ``offload_optimizer`` is the optimizer-offload ledger ("zero2-offload": the fp32 master weights, gradients and
    Adam states on the host), ZeRO-3 with both offloads the "zero3-offload" sharding; None for any other."""
    zero = _zero_section(config) if config else {}
    optimizer, param = _offload_device(zero, "offload_optimizer"), _offload_device(zero, "offload_param")
    if zero.get("stage") in (1, 2) and optimizer == "cpu" and param is None:
        return engine_for(2, optimizer=True)
    if zero.get("stage") == 3 and optimizer == "cpu" and param == "cpu":
        return engine_for(3, optimizer=True, parameters=True)
    return None


class HostOffload(NamedTuple):
    """What a candidate's engine keeps in host memory: where its optimizer steps ("deepspeed": DeepSpeed's CPU Adam;
    "torch": the Trainer's optimizer on the CPU; None: on the device) and whether its weights live there too."""

    optimizer: Optional[str]
    parameters: bool


def host_offload(candidate: Candidate) -> HostOffload:
    """The offload of autofit's rungs (optimizer offload, ZeRO-3 and FSDP2 offload) or of the user's own DeepSpeed
    configuration (``offload_optimizer``, ZeRO-3's ``offload_param``): one reading for every door."""
    if candidate.optimizer_offload:
        return HostOffload("deepspeed", False)
    sharding = engine_of(candidate.sharding)
    if sharding is not None and sharding.offloads_parameters:
        return HostOffload("deepspeed" if sharding.deepspeed else "torch", True)
    if candidate.sharding is not None:
        return HostOffload(None, False)
    config = user_deepspeed(candidate)
    zero = _zero_section(config) if config else {}
    optimizer = "deepspeed" if _offload_device(zero, "offload_optimizer") else None
    return HostOffload(optimizer, zero.get("stage") == 3 and _offload_device(zero, "offload_param") is not None)


def as_launched(candidate: Candidate) -> Candidate:
    """The candidate with its user's DeepSpeed offload as the engine the ledger models (the probes run the user's own
    configuration as written: only the ledger reads it this way)."""
    if candidate.named_engine:
        return candidate
    engine = engine_of(user_offload_engine(user_deepspeed(candidate)))
    if engine is not None and engine.optimizer_offload:
        return candidate.replace(offload=engine.name)
    if engine is not None and candidate.ranks > 1:
        return candidate.replace(sharding=engine.name)
    return candidate


def unmodelled_deepspeed(given: Any) -> Optional[str]:
    """Why a ``deepspeed`` training argument is not modelled, or None when it is (or is not given)."""
    if given in (None, "", {}):
        return None
    config = read_deepspeed(given)
    if config is None:
        return f"a DeepSpeed config of your own that could not be read ({given})"
    zero = _zero_section(config)
    if zero.get("stage") not in (1, 2, 3):
        return "a DeepSpeed config of your own without a ZeRO stage 1-3"
    if _offloads(zero) and user_offload_engine(config) is None:
        return "a DeepSpeed config of your own that offloads (its host buffers are not modelled)"
    return None


def nccl_bytes(candidate: Candidate, device: str) -> float:
    """NCCL's device buffers on each GPU when several train together (none on the CPU, none for one GPU)."""
    return NCCL_BYTES_PER_GPU if device == "cuda" and candidate.ranks > 1 else 0.0
