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
    # ModelConfig's lora_modules_to_save: modules trained whole beside the adapters (peft's copy of each)
    modules_to_save: Tuple[str, ...] = ()
    use_rslora: bool = False  # ModelConfig's use_rslora: the adapters' scaling alpha/sqrt(r) (no memory of its own)

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):  # from JSON, or a user's file
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if not isinstance(self.modules_to_save, tuple):
            object.__setattr__(self, "modules_to_save", tuple(self.modules_to_save or ()))


@dataclass(frozen=True)
class QuantSettings:
    """bitsandbytes' 4-bit settings, as ModelConfig names them (``bnb_4bit_quant_type``, ``use_bnb_nested_quant``,
    ``bnb_4bit_quant_storage``). A candidate without them runs the quantization rung's own: nf4 with nested
    quantization, packed in uint8."""

    quant_type: str = "nf4"
    nested: bool = True
    storage: str = "uint8"


# Attention kernels transformers runs on any device; the others need CUDA and, some, a package of their own.
PORTABLE_ATTENTION = ("eager", "sdpa")
ATTENTION_PACKAGES = {"flash_attention_2": ("flash_attn",),
                      "flash_attention_3": ("flash_attn_interface", "flash_attn_3")}
KERNELS_PACKAGE = "kernels"  # a kernels-hub name ("kernels-community/flash-attn") loads through it


def runnable_attention(name: Optional[str], device: str) -> Tuple[Optional[str], Optional[str]]:
    """(the attention the probes load the model with, None: transformers' default, sdpa; why it is not ``name``, the
    user's ModelConfig ``attn_implementation``, or None when the probes run it as written)."""
    if not name or name == "sdpa":
        return None, None
    if name in PORTABLE_ATTENTION:
        return name, None
    if device != "cuda":
        return None, f"{name} needs a CUDA GPU"
    packages = ATTENTION_PACKAGES.get(name, (KERNELS_PACKAGE,) if "/" in name else ())
    if packages and not any(importlib.util.find_spec(package) is not None for package in packages):
        return None, f"{name} needs the {packages[0]} package, which is not installed"
    return name, None


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
    bnb: Optional[QuantSettings] = None  # the 4-bit settings of the user's file; None: the rung's (QuantSettings())
    # The attention kernel the probes load the model with (ModelConfig's attn_implementation where this machine runs
    # it); None: transformers' default (sdpa)
    attn_implementation: Optional[str] = None
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
    # The engine of the user's launch that a rung's engine replaced, in words (``autofit.rungs._ladder``); None: none
    replaces: Optional[str] = None
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
        if self.attn_implementation is not None:  # as TRL's scripts pass ModelConfig's attn_implementation
            user_init = args.get("model_init_kwargs")
            args["model_init_kwargs"] = {**(user_init if isinstance(user_init, dict) else {}),
                                         "attn_implementation": self.attn_implementation}
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
            modules_to_save=list(self.lora.modules_to_save) or None,
            use_rslora=self.lora.use_rslora,
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
        bnb = self.bnb or QuantSettings()
        return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
            load_in_4bit=True,
            bnb_4bit_quant_type=bnb.quant_type,
            bnb_4bit_use_double_quant=bnb.nested,
            bnb_4bit_compute_dtype=compute,
            bnb_4bit_quant_storage=bnb.storage,
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
        if data.get("bnb") is not None:
            data["bnb"] = QuantSettings(**data["bnb"])
        return cls(**data)

    def key(self) -> str:
        """Stable identity of what is measured (the rung names that led here do not change the measurement)."""
        data = self.to_dict()
        data.pop("rungs")
        data.pop("replaces")  # words, like the rung names: the measurement is the same
        for late in ("dtype", "offload", "bnb", "attn_implementation"):  # added after studies were stored: keep
            if data.get(late) is None:                                    # their keys
                data.pop(late)
        if data.get("lora"):
            for late, unset in (("modules_to_save", []), ("use_rslora", False)):
                if data["lora"].get(late) in (unset, ()):
                    data["lora"].pop(late)
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
            parts.append(f"lora{self.lora.r}" + ("+" + ",".join(self.lora.modules_to_save)
                                                 if self.lora.modules_to_save else ""))
        if self.attn_implementation:
            parts.append(self.attn_implementation)
        return " ".join(parts)
