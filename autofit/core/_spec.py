"""The question a search answers, ``SearchSpec``: the user's options as given (``SearchOptions``) and what they resolve
to on this machine, computed once (``SearchSpec.plan``; the search's and the estimate's doors find the device, the
budget and the GPUs first). Every bad value raises ``InputError`` with one line that names it."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from typing import Any, Dict, Optional, Tuple

from autofit.core._algorithms import ALGORITHMS, algorithm
from autofit.core._candidate import Candidate
from autofit.core._compat import checkpointing_field
from autofit.core._errors import InputError
from autofit.core._knobs import on_device, searched_keys
from autofit.core._launch import Launch
from autofit.core._options import AUTO_VERIFY, DEVICES, SearchOptions, ladder_names
from autofit.core._sizes import format_size

log = logging.getLogger(__name__)


# --verify-steps auto: at least this many optimizer steps (every phase is seen in each), at most
# AUTO_VERIFY_MAX_STEPS, and no more once AUTO_VERIFY_TIME_CAP_S seconds of training have passed.
AUTO_VERIFY_MIN_STEPS = 3
AUTO_VERIFY_MAX_STEPS = 10
AUTO_VERIFY_TIME_CAP_S = 60.0
# Kept free on CUDA: a few optimizer steps do not show all the fragmentation a long run builds up.
CUDA_HEADROOM = 0.03
# Sizes no single device can be meant for: refused at once instead of building rows until the host runs out.
MAX_EFFECTIVE_BATCH = 2**16
MAX_TOKENS_PER_STEP = 2**31


# The built-in trainer factories (``autofit.probe.algos``) by algorithm, imported by name in the probe.
FACTORIES = {a.name: a.factory for a in ALGORITHMS.values()}
# What autofit sets on every candidate: a user's value for one of these is replaced (and said so).
SEARCHED_ARGS = searched_keys(a.length_field for a in ALGORITHMS.values())
# The baseline's settings that its study key always held; those added later are left out at their default (stored
# studies keep their names).
FIRST_SETTINGS = ("checkpointing", "optim", "lora", "quantization", "activation_offload")


@dataclass(frozen=True)
class Baseline:
    """The user's own run (their TRL config file, ``--config``; an accelerate config) as the ladder's first level: the
    settings the search keeps unless fitting needs a change. ``settings``: the candidate's fields as the knobs read
    them from the file (the launch's ``file_baseline``: checkpointing, optimizer, LoRA, quantization, ...);
    a field not among them is the search's own baseline's (no checkpointing, full fine-tuning, TRL's optimizer)."""

    settings: Tuple[Tuple[str, Any], ...] = ()
    micro_batch: Optional[int] = None  # per rank, with ``grad_accum``: the user's split of the effective batch
    grad_accum: Optional[int] = None
    # the engine of the user's launch (``fsdp:``/``fsdp_config:``, ``accelerate_config:``): an engine of
    # ``autofit.core._engines`` (a sharding rung's, or the optimizer-offload engine)
    sharding: Optional[str] = None
    source: str = ""  # the file, for messages

    def get(self, name: str) -> Any:
        """The run's value of a candidate field (its default where the run does not set it)."""
        return dict(self.settings).get(name, _default(name))

    def candidate_changes(self, device: str) -> Dict[str, Any]:
        """The fields of the ladder's first level on ``device`` (the attention kernel a probe here can load)."""
        return {name: on_device(name, value, device) for name, value in self.settings}

    def key(self) -> str:
        """What the baseline measures (not where it came from): part of the study's name."""
        data: Dict[str, Any] = {"micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                                "sharding": self.sharding}
        data.update({name: _default(name) for name in FIRST_SETTINGS})
        for name, value in self.settings:
            if name in FIRST_SETTINGS or value not in (_default(name), None, False, ()):
                data[name] = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
        return json.dumps(data, sort_keys=True, default=str)


def _default(name: str) -> Any:
    found = {f.name: f for f in fields(Candidate)}[name]
    return None if found.default is MISSING else found.default


@dataclass(frozen=True)
class SearchSpec:
    """The options as the user gave them, and what they resolve to here. Built by ``plan``; never changed after."""

    options: SearchOptions
    device: str  # "cuda" or "cpu"
    gpu_bytes: Optional[int]  # each GPU's memory as planned for: --gpu-memory, else the card's
    budget_bytes: Optional[int]  # what the trainer may hold per GPU: gpu_bytes, less vLLM's estimated share or what
    #                              other processes hold on a busy GPU
    max_length: int  # the length searched: the sequence (sft, reward) or the completion (grpo, rloo, ppo)
    min_length: int  # the shorter-length rung's floor
    ranks: int = 1  # processes (GPUs) that train together on this machine (--gpus): what probes run
    ladder: Optional[Tuple[str, ...]] = None  # rung names; None: the default ladder
    user_args: Dict[str, Any] = field(default_factory=dict)  # the user's own config fields, and --beta
    headroom: float = 0.0  # fraction of the budget kept free
    factory: Optional[str] = None  # the identity of the user's factory; None: the built-in one of the algorithm
    notes: Tuple[str, ...] = ()  # what resolving decided and the user should know (a busy GPU, vLLM's share)
    baseline: Optional[Baseline] = None  # the user's run from their config file: the ladder starts there
    launch: Launch = Launch()  # the user's launch as the door read it (the export writes best.yaml from its file)

    @classmethod
    def plan(cls, options: SearchOptions, *, device: str, gpu_bytes: Optional[int],
             budget_bytes: Optional[int] = None, ranks: int = 1, factory: Optional[str] = None,
             notes: Tuple[str, ...] = (), baseline: Optional[Baseline] = None, probed: bool = True,
             launch: Launch = Launch()) -> SearchSpec:
        """The question from checked options and what the door resolved: the device ("cuda" or "cpu"), each GPU's
        memory, the trainer's budget (``gpu_bytes`` unless given), the ranks on this machine. ``probed=False`` (the
        estimate): nothing runs the trainer here, so the installed TRL need not have it. A search on the CPU needs a
        budget (the doors ask for it: ``autofit.search.question``, after weighing the host's memory)."""
        if device not in ("cuda", "cpu"):
            raise InputError(f"device '{device}' is not valid: accepted are {', '.join(DEVICES)}")
        missing = algorithm(options.algo).available() if factory is None and probed else None
        if missing:
            raise InputError(missing)
        if factory is None and options.algo not in FACTORIES:
            raise InputError(f"unknown algo '{options.algo}': accepted are {', '.join(FACTORIES)}")
        for given in (gpu_bytes, budget_bytes):
            if given is not None and (not isinstance(given, int) or isinstance(given, bool) or given <= 0):
                raise InputError(f"memory budget {given!r} is not valid: it must be a positive number of bytes")
        if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
            raise InputError(f"--gpus {ranks!r} is not valid: a positive number of GPUs or 'all' is accepted")
        length, floor = options.length, options.length_floor
        if options.effective_batch > MAX_EFFECTIVE_BATCH:
            raise InputError(f"--effective-batch {options.effective_batch} is not valid: at most "
                             f"{MAX_EFFECTIVE_BATCH:,} sequences per optimizer step on one device")
        if options.effective_batch * length > MAX_TOKENS_PER_STEP:
            raise InputError(f"--effective-batch {options.effective_batch} x length {length} is "
                             f"{options.effective_batch * length:,} tokens per optimizer step: at most "
                             f"{MAX_TOKENS_PER_STEP:,} on one device")
        world = ranks * options.nodes
        if options.effective_batch % world:
            where = f"--gpus {ranks}" + (f" x --nodes {options.nodes}" if options.nodes > 1 else "")
            raise InputError(f"--effective-batch {options.effective_batch} cannot be split evenly over {where}: "
                             f"use a multiple of {world}")
        ladder = ladder_names(options.ladder)
        headroom = options.headroom
        if headroom is None:
            headroom = CUDA_HEADROOM if device == "cuda" else 0.0
        return cls(options=options, device=device, gpu_bytes=gpu_bytes,
                   budget_bytes=gpu_bytes if budget_bytes is None else budget_bytes, max_length=length,
                   min_length=floor, ranks=ranks, ladder=tuple(ladder) if ladder is not None else None,
                   user_args=user_training_args(options.training_args, options.beta), headroom=headroom,
                   factory=factory or None, notes=tuple(notes), baseline=baseline, launch=launch)

    @property
    def rank_batch(self) -> int:
        """Sequences per optimizer step on each rank (micro-batch x accumulation), over every node."""
        return self.options.effective_batch // (self.ranks * self.options.nodes)

    def verify_plan(self) -> Tuple[int, int, Optional[float]]:
        """(at most this many optimizer steps, at least this many, time cap in seconds) of the verification."""
        steps = self.options.verify_steps
        if steps == AUTO_VERIFY:
            return AUTO_VERIFY_MAX_STEPS, AUTO_VERIFY_MIN_STEPS, AUTO_VERIFY_TIME_CAP_S
        return int(steps), int(steps), None

    def study_name(self) -> str:
        """Same question, same study: running the same command again resumes it. Readable where Optuna's tools list
        studies (the algorithm, model, budget and batch), with a digest of the whole question (``question_key``)."""
        o = self.options
        budget = format_size(self.budget_bytes) if self.budget_bytes is not None else "no budget"
        digest = hashlib.sha256(self.question_key().encode()).hexdigest()[:10]
        return f"{o.algo} {o.model} on {self.device} {budget}, effective batch {o.effective_batch} [{digest}]"

    def question_key(self) -> str:
        """Every setting that changes what a probe measures or which configuration is chosen."""
        o = self.options
        parts = [
            o.algo, o.model, self.device, str(self.budget_bytes), str(self.max_length), str(self.min_length),
            str(o.effective_batch), o.maximize, ",".join(self.ladder or ["default"]),
            str(sorted(self.user_args.items())), str(o.real_weights), self.factory or "", str(o.probe_steps),
        ]
        if o.dtype is not None:  # added later: studies stored without it keep their names
            parts.append(f"dtype={o.dtype}")
        if o.trust_remote_code:
            parts.append("trust_remote_code")
        if self.ranks > 1:
            parts.append(f"ranks={self.ranks}")
        if o.nodes > 1:
            parts.append(f"nodes={o.nodes}")
        if o.use_vllm is not None:
            parts.append(f"vllm={o.use_vllm}:{o.vllm_gpu_memory_utilization:g}")
        if algorithm(o.algo).rl:
            parts += [str(o.num_generations), str(o.max_prompt_length)]
        if self.baseline is not None:
            parts.append(f"baseline={self.baseline.key()}")
        return "|".join(parts)


def user_training_args(training_args: Optional[Dict[str, Any]], beta: Optional[float]) -> Dict[str, Any]:
    """The user's own training arguments, passed through; those autofit searches are replaced, with a warning
    that names them (so the exported settings never contradict each other)."""
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
