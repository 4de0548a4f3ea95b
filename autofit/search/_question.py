"""One door's options in, one validated ``SearchSpec`` out: ``autofit search`` and ``autofit.fit`` take the same
options with the same names and meanings (a test derives the CLI's from its parser and checks fit()'s signature),
and both go through ``search_spec`` here, so their checks and messages are one."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from autofit.core import RL_ALGOS
from autofit.core import checkpointing_field
from autofit.core import NoCudaDeviceError, first_gpu, resolve_device, resolve_gpus
from autofit.core import DEVICES, SearchSpec
from autofit.core import InputError
from autofit.core import parse_size

log = logging.getLogger(__name__)

MIN_BUDGET_BYTES = 2**20
# What autofit sets on every candidate: a user's value for one of these is replaced (and said so).
SEARCHED_ARGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "activation_checkpointing",
                 "gradient_checkpointing", "max_length", "max_completion_length", "response_length", "num_generations")


def budget_bytes(device: str, gpu_memory: Union[None, str, int]) -> Optional[int]:
    """--gpu-memory as bytes (a size with a unit, or an integer number of bytes); on CUDA the card's by default."""
    if gpu_memory is None:
        if device == "cuda":
            gpu = first_gpu()
            return gpu.total_bytes if gpu else None
        return None
    if isinstance(gpu_memory, bool) or not isinstance(gpu_memory, (str, int)):
        raise InputError(f"gpu_memory {gpu_memory!r} is not valid: give a size with a unit, e.g. '24GiB' or "
                         "'1.5GiB', or an integer number of bytes")
    nbytes = parse_size(gpu_memory) if isinstance(gpu_memory, str) else gpu_memory
    if nbytes < MIN_BUDGET_BYTES:
        raise InputError(f"gpu_memory {gpu_memory!r} is not valid: {nbytes} bytes is below 1 MiB; give a size with a "
                         "unit, e.g. '24GiB'")
    return nbytes


def ladder_names(ladder: Union[None, str, Sequence[Any]]) -> Optional[List[str]]:
    """A ladder given as "name,name" (the CLI's form) or as a list of rung names."""
    if ladder is None:
        return None
    names = [name.strip() for name in ladder.split(",")] if isinstance(ladder, str) else list(ladder)
    names = [name for name in names if not (isinstance(name, str) and not name)]
    if not names:
        raise InputError(f"--ladder {ladder!r} names no rung")
    return names


def _lengths(algo: str, max_length, min_length, max_completion_length, min_completion_length, beta):
    """(max_length, min_length) of the search: the sequence for sft and reward, the completion for RL."""
    if algo in RL_ALGOS:
        if max_length is not None or min_length is not None:
            raise InputError(f"--max-length/--min-length do not apply to {algo}: use --max-completion-length "
                             "and --min-completion-length")
        if beta is not None and algo == "ppo":
            raise InputError("--beta applies to grpo and rloo; PPO's KL coefficient is PPOConfig.kl_coef")
        return max_completion_length or 512, min_completion_length
    flags = [flag for flag, value in (("--max-completion-length", max_completion_length),
                                      ("--min-completion-length", min_completion_length),
                                      ("--beta", beta)) if value is not None]
    if flags:
        raise InputError(f"{flags[0]} applies to grpo and rloo, not to '{algo}'")
    return max_length or 1024, min_length


def user_training_args(training_args: Optional[Dict[str, Any]], beta: Optional[float]) -> Dict[str, Any]:
    """The user's own training arguments, passed through; those autofit searches are replaced, with a warning
    that names them (so the exported settings never contradict each other)."""
    if training_args is not None and not isinstance(training_args, dict):
        raise InputError(f"training_args {training_args!r} is not valid: a dict of config fields is accepted")
    args = dict(training_args or {})
    clashes = [key for key in SEARCHED_ARGS if key in args]
    if clashes:
        log.warning("training_args sets %s: autofit searches %s, so the candidate's value%s used (the exported "
                    "configuration writes checkpointing as %s)", ", ".join(clashes),
                    "it" if len(clashes) == 1 else "them", " is" if len(clashes) == 1 else "s are",
                    checkpointing_field())
        for key in clashes:
            args.pop(key)
    if beta is not None:
        args["beta"] = beta
    return args


def search_spec(
    *,
    model: str,
    algo: str = "sft",
    factory: Optional[str] = None,
    gpu_memory: Union[None, str, int] = None,
    device: str = "auto",
    max_length: Optional[int] = None,
    min_length: Optional[int] = None,
    max_completion_length: Optional[int] = None,
    min_completion_length: Optional[int] = None,
    max_prompt_length: int = 128,
    num_generations: Optional[int] = None,
    beta: Optional[float] = None,
    effective_batch: int = 8,
    gpus: Union[int, str] = 1,
    nodes: int = 1,
    use_vllm: Optional[str] = None,
    vllm_gpu_memory_utilization: float = 0.3,
    maximize: str = "batch",
    ladder: Union[None, str, Iterable[str]] = None,
    out_dir: Union[str, Path] = "autofit-out",
    real_weights: bool = False,
    dtype: Optional[str] = None,
    probe_steps: int = 2,
    verify_steps: Union[int, str] = "auto",
    probe_timeout_s: float = 900.0,
    build_timeout_s: float = 600.0,
    max_probes: Optional[int] = None,
    headroom: Optional[float] = None,
    predict: bool = True,
    allow_busy_gpu: bool = False,
    trust_remote_code: bool = False,
    training_args: Optional[Dict[str, Any]] = None,
) -> SearchSpec:
    """The validated question; every bad value raises ``InputError`` with one line naming it."""
    if not isinstance(model, str) or not model:
        raise InputError(f"model {model!r} is not valid: a hub id or a local folder is accepted")
    if device not in DEVICES:
        raise InputError(f"--device '{device}' is not valid: accepted are {', '.join(DEVICES)}")
    try:
        resolved = resolve_device(device)
    except NoCudaDeviceError as exc:
        raise InputError(str(exc)) from None
    if beta is not None and (isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta)
                             or beta < 0):
        raise InputError(f"--beta {beta!r} is not valid: a finite number, 0 or more, is accepted")
    for name, value in (("probe-timeout", probe_timeout_s), ("build-timeout", build_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise InputError(f"--{name} {value!r} is not valid: a positive, finite number of seconds is accepted")
    if not isinstance(algo, str):
        raise InputError(f"algo {algo!r} is not valid: a name such as 'sft' or 'grpo' is accepted")
    length, floor = _lengths(algo, max_length, min_length, max_completion_length, min_completion_length, beta)
    try:
        ranks = resolve_gpus(gpus, resolved)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return SearchSpec(
        model=model, algo=algo, device=resolved, budget_bytes=budget_bytes(resolved, gpu_memory), max_length=length,
        min_length=floor, num_generations=num_generations, prompt_length=max_prompt_length,
        user_args=user_training_args(training_args, beta), effective_batch=effective_batch, ranks=ranks, nodes=nodes,
        vllm=use_vllm, vllm_utilization=vllm_gpu_memory_utilization, maximize=maximize,
        ladder=ladder_names(ladder), real_weights=real_weights, dtype=dtype, factory=factory,
        out_dir=Path(out_dir), probe_steps=probe_steps, verify_steps=verify_steps, probe_timeout_s=probe_timeout_s,
        build_timeout_s=build_timeout_s, max_probes=max_probes, headroom=headroom, predict=predict,
        allow_busy_gpu=allow_busy_gpu, trust_remote_code=trust_remote_code,
    )


MAX_PARAMETERS = 10**13  # ten trillion: no configuration one device could probe


def check_model_sizes(spec: SearchSpec, config: Dict[str, Any]) -> None:
    """Refuse lengths the model cannot take and configurations no device could hold, with the limit named."""
    from autofit.core import RL_ALGOS as rl
    from autofit.memory_model import ModelShape, param_counts

    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    positions = text.get("max_position_embeddings")
    length = spec.max_length + (spec.prompt_length if spec.algo in rl else 0)
    if isinstance(positions, int) and length > positions:
        what = "prompt + completion" if spec.algo in rl else "--max-length"
        raise InputError(f"{what} {length} is above the model's max_position_embeddings ({positions:,}): lower it, or "
                         "raise max_position_embeddings in config.json if you extend the context")
    try:
        total = param_counts(ModelShape.from_config(config), spec.algo).total
    except (KeyError, ValueError, TypeError):
        return  # an architecture the ledger does not describe: the probes will tell
    if total > MAX_PARAMETERS:
        raise InputError(f"model '{spec.model}': its configuration describes {total:,} parameters, more than "
                         f"{MAX_PARAMETERS:,}: check num_hidden_layers, hidden_size and vocab_size in config.json")


def check_model_code(name: str, config: Dict[str, Any], trust_remote_code: bool) -> None:
    """A model whose type the installed transformers does not know runs only with its own code, and only when the
    user says so: refused before any probe, with the type named and the flag."""
    from autofit.core import one_line
    from autofit.core import needs_own_code

    model_type = needs_own_code(config)
    if model_type is not None and not trust_remote_code:
        raise InputError(f"model '{one_line(name)}' has model_type '{one_line(model_type)}', which transformers does not "
                         "know: it needs the model's own code (auto_map in its config.json), and autofit runs it "
                         "only with --trust-remote-code (trust_remote_code=True in fit())")
