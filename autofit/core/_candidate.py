"""A candidate training configuration: what one probe runs and what the export writes.

A ``Candidate`` is plain, frozen data that crosses the process boundary to a probe worker (it is pickled) and
is stored in the Optuna study as JSON. Trainer factories read it through three small methods:
``training_args()`` for the TRL config dataclass, ``peft_config()`` and ``quantization_config()`` for the
trainer's constructor arguments.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple, Union

from autofit.core._algorithms import ALGORITHMS, Algorithm, algorithm, algorithm_names

# Config field that holds the searched sequence length, per algorithm (RL: the completion length).
LENGTH_FIELD = {a.name: a.length_field for a in ALGORITHMS.values()}
RL_ALGOS = algorithm_names(rl=True)
# Micro-batches per optimizer step that a probe of SFT or a reward model runs: from the second on, the gradients
# are resident and nothing else grows, so more would cost time and show nothing (a test measures it). RL keeps all:
# TRL generates for the whole generation batch (micro-batch x steps_per_generation) at once.
PROBE_ACCUMULATION = 2

LORA_TARGETS = "all-linear"
PROBE_DDP_TIMEOUT_S = 300
TRL_VLLM_UTILIZATION = 0.3  # GRPOConfig.vllm_gpu_memory_utilization


@dataclass(frozen=True)
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: Union[str, Tuple[str, ...]] = LORA_TARGETS  # "all-linear", or module names as peft takes them

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):  # from JSON, or a user's file
            object.__setattr__(self, "target_modules", tuple(self.target_modules))


@dataclass(frozen=True)
class ProbeSettings:
    """Probe-only training arguments: never exported. ``time_cap_s``: the run stops once this many seconds of
    training have passed and at least ``min_steps`` optimizer steps have run (``steps`` stays the most it runs)."""

    steps: int
    output_dir: str
    min_steps: int = 0
    time_cap_s: Optional[float] = None
    build_timeout_s: Optional[float] = None  # the factory must return the trainer within this
    full_accumulation: bool = False  # run every micro-batch of the effective batch (tests of the shortcut)
    # (rung name, "module:attribute") of the ladder's rungs' probe steps, which the probe's child imports (the
    # built-in rungs' it considers anyway): ``autofit.rungs.probe_steps``
    rung_steps: Tuple[Tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Candidate:
    algo: str
    model: str
    device: str  # "cuda" or "cpu"
    micro_batch: int
    grad_accum: int
    max_length: int
    checkpointing: bool = False
    optim: Optional[str] = None  # None: the TRL config's default
    lora: Optional[LoraSettings] = None
    quantization: Optional[str] = None  # None, "8bit" or "4bit"
    # The dtype the weights are loaded in (``model_init_kwargs["dtype"]``): None is TRL's default, float32.
    dtype: Optional[str] = None
    trust_remote_code: bool = False  # the model's own code runs (``--trust-remote-code``)
    # The engine that offloads optimizer states to host memory (``autofit.rungs._engines``), None: plain TRL.
    offload: Optional[str] = None
    # TRL's ``activation_offloading`` (SFT, reward): saved activations wait in host memory for the backward pass.
    activation_offload: bool = False
    # Liger's Triton kernels (``use_liger_kernel``): RMSNorm, SwiGLU and RoPE that save fewer activations (CUDA).
    liger: bool = False
    # Processes (one per GPU) that train together, and the engine that shards the training state across them
    # (``autofit.rungs._engines``: "zero1", "zero2", "zero3", "fsdp2"; None: plain data parallel with several ranks).
    ranks: int = 1
    sharding: Optional[str] = None
    # RL: vLLM generates ("colocate": in the training process, "server": elsewhere); the trainer does not.
    vllm: Optional[str] = None
    vllm_utilization: Optional[float] = None  # colocate: the share of the card vLLM takes
    env: Tuple[Tuple[str, str], ...] = ()
    rungs: Tuple[str, ...] = ()
    # Training arguments the user fixed (learning rate, ...): passed through untouched.
    user_args: Tuple[Tuple[str, Any], ...] = ()
    real_weights: bool = False
    # RL only: completions per prompt (None: the config class's default) and the synthetic prompts' length.
    num_generations: Optional[int] = None
    prompt_length: Optional[int] = None
    probe: Optional[ProbeSettings] = field(default=None, compare=False)

    @property
    def effective_batch(self) -> int:
        """Sequences per optimizer step, over every rank."""
        return self.micro_batch * self.grad_accum * self.ranks

    @property
    def engine(self) -> Optional[str]:
        """The engine the probe runs under (its accelerate config): offload, sharding, or data parallel."""
        if self.offload:
            return self.offload
        if self.sharding:
            return self.sharding
        return "ddp" if self.ranks > 1 else None

    @property
    def tokens_per_step(self) -> int:
        return self.effective_batch * (self.max_length + (self.prompt_length or 0))

    @property
    def unit(self) -> Algorithm:
        """The algorithm's registry entry (``autofit.core._algorithms``)."""
        return algorithm(self.algo)

    @property
    def is_rl(self) -> bool:
        return self.unit.rl

    @property
    def probe_accumulation(self) -> int:
        """Micro-batches per optimizer step as run: all of them outside probes, for RL, or when asked."""
        if self.probe is None or self.probe.full_accumulation or self.is_rl:
            return self.grad_accum
        return min(self.grad_accum, PROBE_ACCUMULATION)

    def replace(self, **changes: Any) -> Candidate:
        return dataclasses.replace(self, **changes)

    def with_rung(self, name: str, **changes: Any) -> Candidate:
        return dataclasses.replace(self, rungs=self.rungs + (name,), **changes)

    # -- what factories read ----------------------------------------------------------------------------------
    def training_args(self) -> Dict[str, Any]:
        """Keyword arguments for the algorithm's TRL config class (SFTConfig, ...)."""
        from autofit.core._compat import checkpointing_field

        args: Dict[str, Any] = dict(self.user_args)
        args.update(per_device_train_batch_size=self.micro_batch, gradient_accumulation_steps=self.grad_accum)
        args[checkpointing_field()] = self.checkpointing
        args[self.unit.length_field] = self.max_length
        if self.optim is not None:
            args["optim"] = self.optim
        if self.dtype is not None:
            user_init = args.get("model_init_kwargs")
            args["model_init_kwargs"] = {**(user_init if isinstance(user_init, dict) else {}), "dtype": self.dtype}
        if self.activation_offload:
            args["activation_offloading"] = True
        if self.liger:
            # the layer kernels only: TRL keeps its own fused LM head and turns Liger's fused cross-entropy off, but
            # after transformers before 5 has applied the kernels (in Trainer.__init__): so it is said here
            user_config = args.get("liger_kernel_config")
            args["use_liger_kernel"] = True
            args["liger_kernel_config"] = {**(user_config if isinstance(user_config, dict) else {}),
                                           "fused_linear_cross_entropy": False}
        if self.trust_remote_code:  # a TRL config field: TRL passes it on to the model, config and tokenizer loading
            args["trust_remote_code"] = True
        if self.num_generations is not None:
            args["num_generations"] = self.num_generations
        if self.vllm and (self.probe is None or importlib.util.find_spec("vllm") is not None):
            args.update(use_vllm=True, vllm_mode=self.vllm)  # a probe without vLLM generates itself (vllm_mode.py)
            if self.vllm == "colocate":
                args["vllm_gpu_memory_utilization"] = self.vllm_utilization or TRL_VLLM_UTILIZATION
        if self.device == "cpu":
            # DeepSpeed runs only where accelerate is not told use_cpu (the probe hides GPUs instead).
            args.update(bf16=False)
            if not self.offload and not (self.sharding or "").startswith("zero"):
                args["use_cpu"] = True
        if self.probe is not None:
            args.update(
                gradient_accumulation_steps=self.probe_accumulation,
                output_dir=self.probe.output_dir,
                max_steps=self.probe.steps,
                save_strategy="no",
                report_to="none",
                logging_steps=1,
                disable_tqdm=True,
                dataloader_num_workers=0,
            )
            if self.ranks > 1:  # a rank left waiting for a dead one gives up (the runner kills it before that)
                args["ddp_timeout"] = PROBE_DDP_TIMEOUT_S
            if self.unit.counts_episodes:  # PPO counts episodes, not steps; its sample generations are evaluation only
                args.update(total_episodes=self.effective_batch * self.probe.steps, num_sample_generations=0)
            elif self.is_rl:  # the worst case: every completion runs to max_completion_length
                args["generation_kwargs"] = {**(args.get("generation_kwargs") or {}), "min_new_tokens": self.max_length}
        return args

    def peft_config(self) -> Any:
        """A peft ``LoraConfig`` or None."""
        if self.lora is None:
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora.r,
            lora_alpha=self.lora.alpha,
            lora_dropout=self.lora.dropout,
            target_modules=list(self.lora.target_modules) if isinstance(self.lora.target_modules, tuple)
            else self.lora.target_modules,
            task_type="SEQ_CLS" if self.unit.sequence_classifier else "CAUSAL_LM",
        )

    def quantization_config(self) -> Any:
        """A transformers ``BitsAndBytesConfig`` or None."""
        if self.quantization is None:
            return None
        import torch
        from transformers import BitsAndBytesConfig

        if self.quantization == "8bit":
            return BitsAndBytesConfig(load_in_8bit=True)  # type: ignore[no-untyped-call]
        compute = torch.float32 if self.device == "cpu" else torch.bfloat16
        return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute,
        )

    # -- identity and storage ---------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("probe")
        data["env"] = dict(self.env)
        data["user_args"] = dict(self.user_args)
        data["rungs"] = list(self.rungs)
        return data

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Candidate:
        data = dict(data)
        data["env"] = tuple(sorted(data.get("env", {}).items()))
        data["user_args"] = tuple(sorted(data.get("user_args", {}).items()))
        data["rungs"] = tuple(data.get("rungs", ()))
        if data.get("lora") is not None:
            data["lora"] = LoraSettings(**data["lora"])
        return cls(**data)

    def key(self) -> str:
        """Stable identity of what is measured (the rung names that led here do not change the measurement)."""
        data = self.to_dict()
        data.pop("rungs")
        for late in ("dtype", "offload"):  # added after studies were stored: keep their keys
            if data.get(late) is None:
                data.pop(late)
        for flag in ("trust_remote_code", "activation_offload", "liger", "sharding", "vllm", "vllm_utilization"):
            if not data.get(flag):
                data.pop(flag, None)
        if data.get("ranks") == 1:
            data.pop("ranks")
        return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def describe(self) -> str:
        parts = [f"mb={self.micro_batch}x{self.grad_accum}" + (f"x{self.ranks}" if self.ranks > 1 else ""),
                 f"len={self.max_length}"]
        if self.ranks > 1 and not self.offload:
            parts.append(self.sharding or "ddp")
        if self.num_generations is not None:
            parts.append(f"gen={self.num_generations}")
        if self.liger:
            parts.append("liger")
        if self.checkpointing:
            parts.append("ckpt")
        if self.activation_offload:
            parts.append("act-offload")
        if self.dtype:
            parts.append(self.dtype)
        if self.optim:
            parts.append(self.optim)
        if self.offload:
            parts.append(self.offload)
        if self.quantization:
            parts.append(f"q{self.quantization}")
        if self.lora:
            parts.append(f"lora{self.lora.r}")
        return " ".join(parts)
