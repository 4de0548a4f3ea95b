"""A ``Candidate``'s fields, and the views of them the knob table reads (``unit``, ``is_rl``, ``replace``): below both
the table, which reads them, and ``Candidate`` (``autofit.core._candidate``), which writes them through it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Tuple, TypeVar

from autofit.core._algorithms import Algorithm, algorithm
from autofit.core._settings import LoraSettings, QuantSettings

Fields = TypeVar("Fields", bound="CandidateFields")


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
class CandidateFields:
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
    # The engine that offloads optimizer states to host memory (``autofit.core._engines``), None: plain TRL.
    offload: Optional[str] = None
    # TRL's ``activation_offloading`` (SFT, reward): saved activations wait in host memory for the backward pass.
    activation_offload: bool = False
    # Liger's Triton kernels (``use_liger_kernel``): RMSNorm, SwiGLU and RoPE that save fewer activations (CUDA).
    liger: bool = False
    # The reference model's log-probs computed before training (``precompute_ref_log_probs``): no reference model held
    precompute_ref: bool = False
    # Processes (one per GPU) that train together, and the engine that shards the training state across them
    # (a sharding rung's engine, ``autofit.core._engines``; None: plain data parallel with several ranks).
    ranks: int = 1
    sharding: Optional[str] = None
    # RL: vLLM generates ("colocate": in the training process, "server": elsewhere); the trainer does not.
    vllm: Optional[str] = None
    vllm_utilization: Optional[float] = None  # colocate: the share of the card vLLM takes
    # colocate: those bytes of the card (its utilization of the card's memory): vLLM reserves them at its start, for
    # its weights, its profiling peak and its KV cache, and holds them through every phase of the step
    vllm_share_bytes: Optional[int] = None
    vllm_max_model_length: Optional[int] = None  # vLLM's max_model_len; None: TRL's, the model's whole context
    vllm_sleep: bool = False  # colocate: TRL's vllm_enable_sleep_mode (sleep level 2 outside generation)
    vllm_server_gpus: int = 0  # server: the node's GPUs trl vllm-serve runs on (tensor parallel); 0: the user's own
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
    def unit(self) -> Algorithm:
        """The algorithm's registry entry (``autofit.core._algorithms``)."""
        return algorithm(self.algo)

    @property
    def is_rl(self) -> bool:
        return self.unit.rl

    def replace(self: Fields, **changes: Any) -> Fields:
        return dataclasses.replace(self, **changes)
