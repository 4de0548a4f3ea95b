"""The question a door asks, resolved once: ``SearchOptions`` (as the user gave them) in, a ``SearchSpec`` out.

``question`` is the search's (``autofit search`` and ``autofit.fit``): the device present, each GPU's memory (the
card's unless ``--gpu-memory``), the GPUs that train together, and the trainer's budget: what other processes leave
on a busy GPU (with ``--allow-busy-gpu``). A colocated vLLM's share is one of the ledger's terms and a part of every
probe's peak (``autofit.probe._metering.vllm_reserved``), so the budget stays the card's.
``estimate_question`` is the estimate's: a GPU this machine need not have, any number of them. Both refuse a model
no probe could run (its code, its sizes) before anything starts. Nothing here changes a spec once it is built.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from typing import Any, Dict, List, Optional, Tuple

from autofit import launch as launches
from autofit.core import (
    RL_ALGOS,
    TRL_KEYS,
    InputError,
    Launch,
    SearchOptions,
    SearchSpec,
    algorithm_names,
    format_size,
    one_line,
    parse_size,
    user_trusts_code,
    vllm_installed,
)
from autofit.machine import (
    NoCudaDeviceError,
    UnknownModelError,
    first_gpu,
    free_bytes,
    other_processes,
    resolve_device,
    resolve_gpus,
    resolve_model,
    visible_gpu_count,
)
from autofit.rungs import ZERO_STAGES, resolve_ladder
from autofit.search._faults import InfrastructureError
from autofit.search._host_memory import check_host_memory

log = logging.getLogger(__name__)

ESTIMATED_ALGOS = algorithm_names(estimated=True)  # the algorithms the ledger describes
# An idle card's free memory is a little under its total (driver reservations): not "busy".
CUDA_IDLE_SLACK_BYTES = 2**30
MAX_PARAMETERS = 10**13  # ten trillion: no configuration one device could probe


def question(options: SearchOptions, factory: Optional[str] = None, launch: Optional[Launch] = None) -> SearchSpec:
    """The search's question on this machine; ``factory``: the identity of the user's trainer factory; ``launch``:
    the user's launch as the door read it (read here where the door did not)."""
    launch = launch if launch is not None else launches.read_launch(vars(options))
    try:
        device = resolve_device(options.device)
        ranks = resolve_gpus(options.gpus, device)
    except (NoCudaDeviceError, ValueError) as exc:
        raise InputError(str(exc)) from None
    gpu_bytes = gpu_memory_bytes(options, device)
    _check_ladder(options)
    config = model_config(options)
    budget, notes = busy_budget(options, device, gpu_bytes, ranks)
    spec = SearchSpec.plan(options, device=device, gpu_bytes=gpu_bytes, budget_bytes=budget, ranks=ranks,
                           factory=factory, notes=tuple(notes) + _config_notes(launch)
                           + tuple(launches.probe_notes(launch, device)),
                           baseline=launches.baseline(launch, options.effective_batch // (ranks * options.nodes)),
                           launch=launch)
    check_model_sizes(spec, config)
    check_host_memory(spec)  # no GPU: the simulated device is the host's memory, and a probe beyond it is a trap
    if spec.device == "cpu" and spec.gpu_bytes is None:
        raise InputError("--gpu-memory is required on the CPU: it is the budget of the simulated device")
    check_engine_installed(launch)
    if spec.device == "cpu" and options.use_vllm == "colocate" and vllm_installed() \
            and spec.user_args.get(TRL_KEYS.vllm_sleep) is True:
        # the CPU build raises "Sleep mode is not supported on current platform" at start: every probe fails
        raise InputError(f"{TRL_KEYS.vllm_sleep}: true: vLLM's CPU build has no sleep mode, so no probe could "
                         "start it on the simulated device; set it false (or leave it out) here, or search on a GPU")
    if options.use_vllm is not None and not vllm_installed():
        spec = dataclasses.replace(spec, notes=spec.notes + tuple(_vllm_notes(spec)))
    elif options.algo in algorithm_names(groups=True) and not vllm_installed():
        spec = dataclasses.replace(spec, notes=spec.notes + (
            "vLLM is not installed: generation was probed through transformers' generate, and vLLM's settings "
            "(gpu_memory_utilization, max_num_seqs, sleep mode) were not searched",))
    return spec


def estimate_question(options: SearchOptions, launch: Optional[Launch] = None) -> SearchSpec:
    """The estimate's question: for a GPU (``--device auto`` is cuda) this machine need not have, ``--gpus`` of them on
    each of ``--nodes`` machines (the ledger at the whole world size); a colocated vLLM's share is a term of the
    ledger."""
    if options.algo not in ESTIMATED_ALGOS:
        raise InputError(f"unknown algo '{options.algo}': accepted are {', '.join(ESTIMATED_ALGOS)}")
    launch = launch if launch is not None else launches.read_launch(vars(options))
    device = "cuda" if options.device == "auto" else options.device
    gpus = options.gpus
    if gpus == "all":
        gpus = visible_gpu_count()
        if not gpus:
            raise InputError("--gpus all: no GPU is visible here to count; give the number of GPUs to estimate for")
    world = int(gpus) * options.nodes
    _check_ladder(options)
    config = model_config(options, probed=False)
    gpu_bytes = gpu_memory_bytes(options, device)
    if gpu_bytes is None:
        raise InputError("--gpu-memory is required for an estimate: the memory of the GPU to plan for, e.g. 24GiB")
    budget = gpu_bytes
    spec = SearchSpec.plan(dataclasses.replace(options, nodes=1), device=device, gpu_bytes=gpu_bytes,
                           budget_bytes=budget, ranks=world, notes=_config_notes(launch),
                           baseline=launches.baseline(launch, options.effective_batch // world), probed=False,
                           launch=launch)
    check_model_sizes(spec, config)
    return spec


def _config_notes(launch: Launch) -> Tuple[str, ...]:
    note = launches.unmodelled_note(launch)
    return (note,) if note else ()


def check_engine_installed(launch: Launch) -> None:
    """``InfrastructureError`` (exit 4, before any probe) where the launch runs DeepSpeed and it is not installed: the
    estimate predicts it without the package, the probes cannot run it."""
    if importlib.util.find_spec("deepspeed") is not None:
        return
    if launch.engine.sharding in ZERO_STAGES:
        what = f"{launch.source}'s engine ({launch.engine.sharding})"
    elif launch.file is not None and launch.file.training.get("deepspeed"):
        what = f"{launch.file.path}'s deepspeed block"
    else:
        return
    raise InfrastructureError(f"{what} runs DeepSpeed, which is not installed here: a search probes your launch's "
                              "engine (pip install 'trl-autofit[deepspeed]'); autofit estimate predicts it without")


def gpu_memory_bytes(options: SearchOptions, device: str) -> Optional[int]:
    """Each GPU's memory as planned for: ``--gpu-memory`` (a size, or a number of bytes), else the card's."""
    if options.gpu_memory is None:
        gpu = first_gpu() if device == "cuda" else None
        return gpu.total_bytes if gpu else None
    return parse_size(options.gpu_memory) if isinstance(options.gpu_memory, str) else int(options.gpu_memory)


def _check_ladder(options: SearchOptions) -> None:
    from autofit.core import ladder_names

    names = ladder_names(options.ladder)
    if names is not None:
        try:
            resolve_ladder(names)
        except ValueError as exc:
            raise InputError(str(exc)) from None


def model_config(options: SearchOptions, probed: bool = True) -> Dict[str, Any]:
    """The model's configuration, refused before anything starts when no probe could run it (one line naming why)."""
    try:
        source = resolve_model(options.model)
    except UnknownModelError as exc:
        raise InputError(str(exc)) from None
    config = source.config
    nested = config.get("text_config")
    text: Dict[str, Any] = nested if isinstance(nested, dict) else config
    if probed and not options.real_weights and not isinstance(text.get("vocab_size"), int):
        raise InputError(f"model '{one_line(options.model)}': its configuration has no \"vocab_size\" (an integer), "
                         "which the synthesized tokenizer of random-weight probes needs; add it, or use --real-weights")
    check_model_code(options.model, config, options.trust_remote_code or user_trusts_code(options.training_args))
    return config


def busy_budget(options: SearchOptions, device: str, gpu_bytes: Optional[int], ranks: int
                ) -> Tuple[Optional[int], List[str]]:
    """Other processes must leave the budget free on every GPU the search uses, or probes run out of memory for
    reasons that are not the candidate's. With ``--allow-busy-gpu`` the budget is what is free on the busiest of them
    (and a note says so); without it, one line names who holds the memory."""
    ranks_checked = range(ranks) if device == "cuda" else range(1)  # the simulated device is the machine's
    frees = [(free_bytes(device, gpu_bytes, rank), rank) for rank in ranks_checked]
    known = [(free, rank) for free, rank in frees if free is not None]
    if not known or gpu_bytes is None:
        return gpu_bytes, []
    free, rank = min(known)
    slack = CUDA_IDLE_SLACK_BYTES if device == "cuda" else 0
    if free + slack >= gpu_bytes:
        return gpu_bytes, []
    holders = "; ".join(p.describe() for p in other_processes(device, rank=rank)) or \
        "other processes (not listed by NVML)"
    holders += f" (GPU {rank} of the search's {ranks})" if ranks > 1 else ""
    if not options.allow_busy_gpu:
        raise InputError(f"the device has {format_size(max(free, 0))} free, less than the budget "
                         f"{format_size(gpu_bytes)}: {holders}; free it, lower --gpu-memory, or pass "
                         "--allow-busy-gpu to search within what is free")
    if free <= 0:
        raise InputError(f"the device has no memory free: {holders}")
    note = (f"the device was busy ({holders}): the budget is what was free when the search started, "
            f"{format_size(free)} instead of {format_size(gpu_bytes)}")
    log.warning("%s", note)
    return free, [note]


def _vllm_notes(spec: SearchSpec) -> List[str]:
    """What was estimated of vLLM where it is not installed (its share is a part of every probe's peak)."""
    from autofit.memory_model import shape_or_none, vllm_lines

    shape = shape_or_none(spec.options.model)
    estimated = [line.removeprefix("vllm: ") for line in vllm_lines(spec, shape)[:1]] if shape is not None else []
    share = int(spec.options.vllm_gpu_memory_utilization * (spec.gpu_bytes or 0))
    trainer = (f"within {format_size((spec.budget_bytes or 0) - share)} beside vLLM's {format_size(share)}"
               if spec.options.use_vllm == "colocate" else f"within {format_size(spec.budget_bytes)}")
    notes = [f"vLLM is not installed here, so its part is estimated only: the probes measured the trainer {trainer} "
             "and generated with transformers, a phase measured but not held against the budget"] + \
        [f"vLLM {line}" for line in estimated]
    for line in notes:
        log.warning("%s", line)
    return notes


def check_model_sizes(spec: SearchSpec, config: Dict[str, Any]) -> None:
    """Refuse lengths the model cannot take and configurations no device could hold, with the limit named."""
    from autofit.memory_model import ModelShape, param_counts

    algo = spec.options.algo
    nested = config.get("text_config")
    text: Dict[str, Any] = nested if isinstance(nested, dict) else config
    positions = text.get("max_position_embeddings")
    length = spec.max_length + (spec.options.max_prompt_length if algo in RL_ALGOS else 0)
    if isinstance(positions, int) and length > positions:
        what = "prompt + completion" if algo in RL_ALGOS else "--max-length"
        raise InputError(f"{what} {length} is above the model's max_position_embeddings ({positions:,}): lower it, or "
                         "raise max_position_embeddings in config.json if you extend the context")
    try:
        total = param_counts(ModelShape.from_config(config), algo).total
    except (KeyError, ValueError, TypeError):
        return  # an architecture the ledger does not describe: the probes will tell
    if total > MAX_PARAMETERS:
        raise InputError(f"model '{spec.options.model}': its configuration describes {total:,} parameters, more than "
                         f"{MAX_PARAMETERS:,}: check num_hidden_layers, hidden_size and vocab_size in config.json")


def check_model_code(name: str, config: Dict[str, Any], trust_remote_code: bool) -> None:
    """A model whose type the installed transformers does not know runs only with its own code, and only when the
    user says so: refused before any probe, with the type named and the flag."""
    from autofit.machine import needs_own_code

    model_type = needs_own_code(config)
    if model_type is not None and not trust_remote_code:
        raise InputError(f"model '{one_line(name)}' has model_type '{one_line(model_type)}', which transformers does "
                         "not know: it needs the model's own code (auto_map in its config.json), and autofit runs it "
                         "only with --trust-remote-code (trust_remote_code=True in fit(), or "
                         "model_init_kwargs: {trust_remote_code: true} in --config)")
