"""What the user asks for, validated: ``SearchSpec``. Every bad value raises ``InputError`` with one line that
names the value and what is accepted."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from autofit.core._candidate import RL_ALGOS
from autofit.core._errors import InputError


MAXIMIZE = ("batch", "length")
# --verify-steps auto: at least this many optimizer steps (every phase is seen in each), at most
# AUTO_VERIFY_MAX_STEPS, and no more once AUTO_VERIFY_TIME_CAP_S seconds of training have passed.
AUTO_VERIFY = "auto"
AUTO_VERIFY_MIN_STEPS = 3
AUTO_VERIFY_MAX_STEPS = 10
AUTO_VERIFY_TIME_CAP_S = 60.0
# Kept free on CUDA: a few optimizer steps do not show all the fragmentation a long run builds up.
CUDA_HEADROOM = 0.03
DEVICES = ("auto", "cuda", "cpu")
DTYPES = ("auto", "bfloat16", "float16", "float32")  # TRL's ModelConfig.dtype choices
# Sizes no single device can be meant for: refused at once instead of building rows until the host runs out.
MAX_EFFECTIVE_BATCH = 2**16
MAX_TOKENS_PER_STEP = 2**31


# The built-in trainer factories (``autofit.probe.algos``) by algorithm, imported by name in the probe.
FACTORIES = {
    "sft": "autofit.probe.algos.sft:build_trainer",
    "grpo": "autofit.probe.algos.rl:build_grpo_trainer",
    "rloo": "autofit.probe.algos.rl:build_rloo_trainer",
    "reward": "autofit.probe.algos.reward:build_trainer",
    "ppo": "autofit.probe.algos.ppo:build_trainer",  # TRL 0.29-1.12 only: see spec.ppo_available
}

GROUP_ALGOS = ("grpo", "rloo")  # algorithms that sample num_generations completions per prompt


def installed_trl() -> str:
    from importlib import metadata

    try:
        return metadata.version("trl")
    except metadata.PackageNotFoundError:
        return "none"


def ppo_available() -> bool:
    """PPOTrainer lives in trl.experimental.ppo from TRL 0.29 to 1.12; TRL 1.13 removed it."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version("0.29") <= Version(installed_trl()) < Version("1.13")
    except InvalidVersion:
        return False


def ppo_message() -> str:
    return (
        f"algo 'ppo' needs TRL 0.29-1.12 (installed trl {installed_trl()}; TRL 1.13 removed PPOTrainer): "
        "overlay it with pip install --no-deps --target ./trl112 trl==1.12.0 and run with PYTHONPATH=./trl112"
    )


@dataclass
class SearchSpec:
    model: str
    algo: str = "sft"
    device: str = "cpu"  # resolved: "cuda" or "cpu"
    budget_bytes: Optional[int] = None
    max_length: int = 1024
    min_length: Optional[int] = None  # floor for the shorter-length rung; None: max_length (never cut)
    effective_batch: int = 8  # sequences per optimizer step over every rank
    ranks: int = 1  # processes (GPUs) that train together on this machine (--gpus): what probes run
    nodes: int = 1  # machines the export is for (--nodes): the probes run one machine's ranks
    vllm: Optional[str] = None  # vLLM generates ("colocate" or "server"; autofit.search._vllm)
    vllm_utilization: float = 0.3  # colocate: the share of each GPU vLLM takes (TRL's vllm_gpu_memory_utilization)
    maximize: str = "batch"
    ladder: Optional[List[str]] = None  # rung names; None: the default ladder
    user_args: Dict[str, Any] = field(default_factory=dict)
    real_weights: bool = False
    dtype: Optional[str] = None  # the weights' load dtype, decided by the user; None: the ladder may choose bf16
    trust_remote_code: bool = False  # a model that needs its own code runs it (the user said so)
    factory: Optional[str] = None  # "module:function"; None: the built-in factory of ``algo``
    # RL (grpo, rloo): completions per prompt (None: TRL's default) and the synthetic prompts' length.
    # For these algorithms max_length/min_length bound the completion length.
    num_generations: Optional[int] = None
    prompt_length: int = 128
    out_dir: Path = Path("autofit-out")
    probe_steps: int = 2
    verify_steps: Union[int, str] = AUTO_VERIFY  # optimizer steps of the verification, or "auto"
    probe_timeout_s: float = 900.0
    build_timeout_s: float = 600.0  # the factory must return the trainer within this (a hang is the factory's)
    max_probes: Optional[int] = None  # probes (verifications aside) before the search stops and chooses
    headroom: Optional[float] = None  # fraction of the budget kept free; None: 3% on CUDA, 0 on the simulated meter
    allow_busy_gpu: bool = False  # search within what other processes leave free (else: exit 2 when it is less)
    predict: bool = True  # use the memory model: its predicted start and its skips (False: plain bisection)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if self.factory is None and self.algo == "ppo" and not ppo_available():
            raise InputError(ppo_message())
        if self.factory is None and self.algo not in FACTORIES:
            raise InputError(f"unknown algo '{self.algo}': accepted are {', '.join(FACTORIES)}")
        if self.device not in ("cuda", "cpu"):
            raise InputError(f"device '{self.device}' is not valid: accepted are {', '.join(DEVICES)}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise InputError(f"--dtype '{self.dtype}' is not valid: accepted are {', '.join(DTYPES)}")
        if self.dtype is not None and self.algo == "ppo":
            raise InputError("--dtype does not apply to ppo: PPOConfig has no model_init_kwargs; load the models "
                             "in the dtype you want in your PPO script")
        if self.maximize not in MAXIMIZE:
            raise InputError(f"--maximize '{self.maximize}' is not valid: accepted are {', '.join(MAXIMIZE)}")
        if isinstance(self.effective_batch, int) and self.effective_batch > MAX_EFFECTIVE_BATCH:
            raise InputError(f"--effective-batch {self.effective_batch} is not valid: at most {MAX_EFFECTIVE_BATCH:,} "
                             "sequences per optimizer step on one device")
        if isinstance(self.effective_batch, int) and isinstance(self.max_length, int) and \
                self.effective_batch * self.max_length > MAX_TOKENS_PER_STEP:
            raise InputError(f"--effective-batch {self.effective_batch} x length {self.max_length} is "
                             f"{self.effective_batch * self.max_length:,} tokens per optimizer step: at most "
                             f"{MAX_TOKENS_PER_STEP:,} on one device")
        if not isinstance(self.ranks, int) or isinstance(self.ranks, bool) or self.ranks < 1:
            raise InputError(f"--gpus {self.ranks!r} is not valid: a positive number of GPUs is accepted")
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or self.nodes < 1:
            raise InputError(f"--nodes {self.nodes!r} is not valid: a positive number of machines is accepted")
        world = self.ranks * self.nodes
        if isinstance(self.effective_batch, int) and self.effective_batch % world:
            where = f"--gpus {self.ranks}" + (f" x --nodes {self.nodes}" if self.nodes > 1 else "")
            raise InputError(f"--effective-batch {self.effective_batch} cannot be split evenly over {where}: "
                             f"use a multiple of {world}")
        if self.verify_steps != AUTO_VERIFY and (not isinstance(self.verify_steps, int) or self.verify_steps < 1):
            raise InputError(f"--verify-steps {self.verify_steps!r} is not valid: use a positive integer or 'auto'")
        for name in ("max_length", "effective_batch", "probe_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InputError(f"{name.replace('_', '-')} {value!r} is not valid: it must be a positive integer")
        if self.budget_bytes is not None and (not isinstance(self.budget_bytes, int) or self.budget_bytes <= 0):
            raise InputError(f"memory budget {self.budget_bytes!r} is not valid: it must be a positive number of bytes")
        if not self.probe_timeout_s > 0:
            raise InputError(f"probe-timeout {self.probe_timeout_s!r} is not valid: it must be a positive number of seconds")
        if self.max_probes is not None and (not isinstance(self.max_probes, int) or self.max_probes < 1):
            raise InputError(f"--max-probes {self.max_probes!r} is not valid: it must be a positive integer")
        if self.headroom is None:
            self.headroom = CUDA_HEADROOM if self.device == "cuda" else 0.0
        if not 0.0 <= self.headroom < 0.5:
            raise InputError(f"--headroom {self.headroom!r} is not valid: use a fraction from 0 to 0.5, e.g. 0.03")
        if self.probe_steps < 2:
            raise InputError(f"probe-steps {self.probe_steps} is not valid: a probe needs at least 2 optimizer steps")
        if self.num_generations is not None:
            if self.algo not in GROUP_ALGOS:
                raise InputError(f"--num-generations applies to {', '.join(GROUP_ALGOS)}, not to '{self.algo}'")
            if not isinstance(self.num_generations, int) or self.num_generations < 2:
                raise InputError(
                    f"--num-generations {self.num_generations!r} is not valid: GRPO/RLOO need at least 2 "
                    "completions per prompt to compare them"
                )
            if self.effective_batch % self.num_generations:
                raise InputError(
                    f"--effective-batch {self.effective_batch} cannot be divided into groups of --num-generations "
                    f"{self.num_generations}: use a multiple of {self.num_generations}"
                )
        if self.vllm is not None:
            if self.vllm not in ("colocate", "server"):
                raise InputError(f"--use-vllm '{self.vllm}' is not valid: accepted are colocate, server")
            if self.algo not in GROUP_ALGOS:
                raise InputError(f"--use-vllm applies to {' and '.join(GROUP_ALGOS)}, not to '{self.algo}'")
        if isinstance(self.vllm_utilization, bool) or not isinstance(self.vllm_utilization, (int, float)) or \
                not 0 < self.vllm_utilization < 1:
            raise InputError(f"--vllm-gpu-memory-utilization {self.vllm_utilization!r} is not valid: a fraction "
                             "between 0 and 1 is accepted")
        if not isinstance(self.prompt_length, int) or self.prompt_length < 1:
            raise InputError(f"--max-prompt-length {self.prompt_length!r} is not valid: it must be a positive integer")
        if self.min_length is None:
            self.min_length = self.max_length if self.maximize == "batch" else min(self.max_length, 128)
        if not isinstance(self.min_length, int) or self.min_length < 1:
            raise InputError(f"min-length {self.min_length!r} is not valid: it must be a positive integer")
        if self.min_length > self.max_length:
            raise InputError(
                f"--min-length {self.min_length} is above --max-length {self.max_length}: it must be at most that"
            )
        if self.device == "cpu" and self.budget_bytes is None:
            raise InputError("--gpu-memory is required on the CPU: it is the budget of the simulated device")
        if self.ladder is not None:
            from autofit.rungs import resolve_ladder

            try:
                resolve_ladder(self.ladder)
            except ValueError as exc:
                raise InputError(str(exc)) from None

    @property
    def rank_batch(self) -> int:
        """Sequences per optimizer step on each rank (micro-batch x accumulation), over every node."""
        return self.effective_batch // (self.ranks * self.nodes)

    def verify_plan(self) -> Tuple[int, int, Optional[float]]:
        """(at most this many optimizer steps, at least this many, time cap in seconds) of the verification."""
        if self.verify_steps == AUTO_VERIFY:
            return AUTO_VERIFY_MAX_STEPS, AUTO_VERIFY_MIN_STEPS, AUTO_VERIFY_TIME_CAP_S
        return int(self.verify_steps), int(self.verify_steps), None

    def study_name(self) -> str:
        """Same question, same study: running the same command again resumes it."""
        parts = [
            self.algo, self.model, self.device, str(self.budget_bytes), str(self.max_length), str(self.min_length),
            str(self.effective_batch), self.maximize, ",".join(self.ladder or ["default"]),
            str(sorted(self.user_args.items())), str(self.real_weights), self.factory or "", str(self.probe_steps),
        ]
        if self.dtype is not None:  # added later: studies stored without it keep their names
            parts.append(f"dtype={self.dtype}")
        if self.trust_remote_code:
            parts.append("trust_remote_code")
        if self.ranks > 1:
            parts.append(f"ranks={self.ranks}")
        if self.nodes > 1:
            parts.append(f"nodes={self.nodes}")
        if self.vllm is not None:
            parts.append(f"vllm={self.vllm}:{self.vllm_utilization:g}")
        if self.algo in RL_ALGOS:
            parts += [str(self.num_generations), str(self.prompt_length)]
        return "|".join(parts)
