"""An analytic memory model: predict a candidate's peak device memory before probing it.

The model is a ledger of named terms in bytes (weights, gradients, optimizer states, activations, the LM-head/loss
buffer, the RL generation phase, a reference model, the allocator's overhead and the CUDA context). Each term is
computed from the model's configuration dict and the candidate, following ``notes/memory-facts.md`` (sections 2.1 to
2.7 and 5.1). The peak is the largest of these phases:

- ``train``: the LM head's backward in a micro-batch (weights, optimizer states from the previous step, gradients
  when ``grad_accum >= 2`` because the 2nd micro-batch runs while they are resident, every saved activation, the
  LM-head buffers);
- ``backward``: a decoder layer's backward (its gradient temporaries, or the recomputed layer with checkpointing);
- ``step``: the end of the backward and the optimizer step (weights, gradients, optimizer states, temporaries);
- ``generation`` (grpo, rloo): the completions of the whole generation batch (KV cache, per-step logits).

Probes calibrate the model (``calibrate``): a scale on the static part (what does not depend on the tokens) and a
scale on the dynamic part (activations, LM-head buffers, generation), fitted by least squares on measured peaks.

Pure Python: this module imports neither torch nor transformers (the search process never imports torch), so the
parameter counts are computed here from the configuration dict. Every coefficient is a named constant below with
its source; "[V]", "[D]", "[M]" are memory-facts' tags (verified, derived, from memory), "[A]" marks an assumption
of this module that only calibration checks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from autofit.candidate import RL_ALGOS, Candidate, LoraSettings

GiB = 2**30

# ---------------------------------------------------------------------------------------------------------------------
# Coefficients. Sources: /work/shared/notes/memory-facts.md (section numbers below) and notes/trl-facts.md.
# ---------------------------------------------------------------------------------------------------------------------

# Bytes per element of a dtype name (the configuration's ``torch_dtype``/``dtype``, ``model_init_kwargs["dtype"]``).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "bf16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4, "float": 4}
DEFAULT_DTYPE_BYTES = 4  # no dtype in the config: transformers builds float32
# The dtype TRL loads the weights in. memory-facts 2.1 says recent TRL loads with dtype="auto"; the installed TRL 1.16
# does not: ``trl.trainer.utils.create_model_from_path`` reads ``dtype = kwargs.get("dtype", "float32")``, so without
# ``model_init_kwargs={"dtype": ...}`` the weights are float32 whatever the checkpoint's dtype (on CUDA too: fp32
# master weights + bf16 autocast, 18 B/param with AdamW) [V code; V measured: Qwen2.5-0.5B (bf16 config) loads as
# 1.84 GiB on the CPU meter]. ``"auto"`` (or None) keeps the configuration's dtype.
TRL_DEFAULT_LOAD_DTYPE = "float32"

# 2.1: TRL trains in bf16 on CUDA (``bf16=None -> True``): activations and matmuls run in 2 bytes under autocast.
# On the CPU autofit sets ``bf16=False``: everything runs in the weights' dtype.
CUDA_COMPUTE_BYTES = 2
# 2.1: fp32 weights + bf16 autocast: autocast caches a bf16 copy of each trainable weight during forward/backward.
AUTOCAST_WEIGHT_COPY_BYTES = 2

# 2.3: NF4 with double quantization = 4 bits + 0.127 bit of absmax per weight = 4.127 bits ~ 0.516 B/param [M].
NF4_BYTES_PER_PARAM = 0.516
# 2.3: LLM.int8 = 1 B/param (the per-row scales are negligible and ignored) [M].
INT8_BYTES_PER_PARAM = 1.0
# 2.3: one linear layer at a time is dequantized to the compute dtype for its matmul (transient) [D].
DEQUANT_TRANSIENT_LAYERS = 1

# 2.2 / trl-facts: PEFT upcasts LoRA adapters to fp32 (autocast_adapter_dtype=True); TRL casts the trainable
# parameters of a 4/8-bit base model to bf16 (sft_trainer.py, "When using QLoRA ... converted to bf16").
LORA_ADAPTER_BYTES = 4
QLORA_ADAPTER_BYTES = 2
# 2.2: lora_dropout > 0 stores a dropped-out copy (2 B) + a bool mask (1 B) of the input of every adapted module:
# +(2+1)·(6h+I) bytes per token per layer for all-linear targets without checkpointing [D]. Bytes at 2-byte compute.
LORA_DROPOUT_BYTES_PER_ELEMENT = 3

# 2.1: AdamW keeps 2 states (exp_avg, exp_avg_sq) in the parameter's dtype (torch; "pure bf16" 4 B/param,
# fp32 8 B/param) [V].
ADAMW_STATES = 2
# 2.1: bitsandbytes 8-bit AdamW: 1 B per moment (2 B/param) for tensors of at least ``min_8bit_size`` = 4096
# elements; smaller tensors keep 32-bit states (2 x 4 B) [V]. Block-wise absmax: one fp32 per 256 elements per
# state [M] (0.03 B/param).
BNB_8BIT_BYTES_PER_PARAM = 2.0
BNB_MIN_8BIT_SIZE = 4096
BNB_32BIT_STATE_BYTES = 4
BNB_BLOCKWISE_ABSMAX_BYTES = 2 * 4 / 256  # checked: bnb 0.50 AdamW8bit, absmax1/absmax2 fp32 per 256 elements
# transformers' Trainer registers every nn.Embedding with ``optim_bits=32`` for bitsandbytes optimizers: the input
# embedding (and so a tied LM head) keeps 32-bit states [V: measured on the CPU meter, tiny-qwen2, 8 B/param].
BNB_EMBEDDING_32BIT = True
# 2.1: HF Adafactor: "slightly more than 4 bytes/param" in practice (HF perf_train_gpu_one) [V].
ADAFACTOR_BYTES_PER_PARAM = 4.0
# 2.1: SGD with momentum keeps 4 B/param; HF's "sgd" has no momentum by default [A].
SGD_BYTES_PER_PARAM = 0.0
# 2.1: the foreach (multi-tensor) AdamW path allocates full-size temporaries (``torch._foreach_sqrt(exp_avg_sqs)``,
# TRL PR #2776): one copy of a state. The fused path (TRL's default ``adamw_torch_fused``) has none [V].
FOREACH_TEMPORARY_COPIES = 1
TIED_EMBEDDING_GRAD_COPIES = 2  # see the "step" phase: end of the backward with tied, trained embeddings
TRL_DEFAULT_OPTIM = "adamw_torch_fused"  # trl-facts table: SFTConfig/GRPOConfig/RLOOConfig ``optim`` default
EIGHT_BIT_OPTIMS = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "adamw_torch_8bit", "lion_8bit",
                    "paged_lion_8bit", "ademamix_8bit", "paged_ademamix_8bit", "rmsprop_bnb_8bit")
ADAMW_OPTIMS = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "paged_adamw_32bit", "adamw_apex_fused",
                "adamw_anyprecision", "adamw_torch_xla", "adamw_torch_npu_fused", "stable_adamw", "ademamix")
UNKNOWN_OPTIM_BYTES_PER_PARAM = 8.0  # an optimizer this table does not know: two fp32 states, conservative [A]

# 2.4, Llama/Qwen (SwiGLU, RMSNorm, no dropout, GQA), HF modules, no checkpointing: bytes saved per token per layer
# at 2-byte activations ≈ c_h·h + 8·I + 4·h_kv, with c_h = 8 (fused norms) ... 16 (HF eager norms) [D].
# Split here so that models whose q width (heads·head_dim) differs from h (gemma3) and models with more norms
# are counted per tensor:
ACT_NORM_BYTES = 4  # per normalized element: 2 (fused) ... 6 (eager, fp32 upcast saved); prior = the middle
ACT_Q_AND_ATTN_OUT_BYTES = 4  # Q (2 B) + attention output (2 B), per q element (heads·head_dim)
ACT_KV_BYTES = 4  # K and V (2 B each), per kv element (kv_heads·head_dim)
ACT_MLP_BYTES = 8  # gate out, up out, act(gate), product: 4 tensors x 2 B, per intermediate element
# ⇒ for a qwen2/llama layer: 4·2h (two norms) + 4h + 4·h_kv + 8·I = c_h 12 (the prior's middle) [D].
# Outside the decoder layers, per token: embedding output, final norm, the hidden state handed to the LM head
# (a compact copy on CUDA) [A]: a few h.
ACT_OUTSIDE_LAYERS_BYTES_PER_H = 8
# A decoder layer's backward allocates gradient temporaries on top of the saved activations: about half a layer's
# saved activations [V: measured on the CPU meter, tiny-qwen2 reward model, 9 KB/token over 18 KB per layer].
BACKWARD_TEMP_LAYERS = 0.5
# 2.4, HF gradient checkpointing: keeps every layer's input (h per token per layer) plus, during the backward, one
# layer's full activations while it is recomputed plus that layer's backward temporaries [V concept].
CKPT_LIVE_LAYERS = 1 + BACKWARD_TEMP_LAYERS
# 2.4, eager (or SDPA math) attention materializes the scores: 5 B x heads x s² x batch per layer (Korthikanti's
# 5as²b, matched by ms-swift's measurement: 4.99 B per score element) [D from V]. SDPA flash/efficient: none.
EAGER_SCORE_BYTES = 5

# trl-facts "Gotcha, fused LM head": TRL 1.16 SFT/GRPO/RLOO never build the full logits; the kernel allocates a
# [min(N, 4096), 32768] buffer in the compute dtype, in forward and again in backward [V code,
# trl/kernels/chunked_logprob.py]. Its backward accumulates the hidden-state gradient in fp32 [N, h] and, when the
# LM head is trained (full fine-tuning), the LM-head weight gradient in fp32 [V, h], cast at the end to the weight
# dtype (both alive for a moment) [V code].
FUSED_HEAD_TOKEN_CHUNK = 4096
FUSED_HEAD_VOCAB_CHUNK = 32768
FUSED_HEAD_GRAD_ACCUM_BYTES = 4
# Without Triton (the CPU), the kernel's torch fallback (``_backward_tile``) materializes whole-tile temporaries of
# [min(N, 4096), min(V, 32768)] live at its peak: 7 fp32 tensors (2 mul, 2 sub, exp, zeros_like, a cast) and a bool
# mask = 29 B per tile element [V: measured on the simulated meter, trl 1.16, tiny-qwen2: 463 MiB at 2044 x 8192].
FUSED_HEAD_TORCH_TILE_BYTES = 29

# 2.6: generation (HF generate) keeps the KV cache of the whole generation batch, and at each step the last
# position's logits: ``.to(float32, copy=True)`` + logits processors (min_new_tokens in probes) + softmax
# probabilities ≈ a few fp32 copies of [B_gen, V] [V code transformers generation/utils.py; count A].
GEN_LOGITS_BYTES = 4
GEN_LOGITS_COPIES = 4
# The prefill runs the prompts of the whole generation batch through one layer at a time without gradients: a few
# intermediate-size and hidden-size tensors per prompt token are live at once [A].
GEN_PREFILL_MLP_COPIES = 3
GEN_PREFILL_HIDDEN_COPIES = 4
# rl.py: synthetic prompts are ``prompt_length or 64`` tokens long.
DEFAULT_PROMPT_LENGTH = 64
# trl-facts table: GRPOConfig.beta defaults to 0.0 (no reference model), RLOOConfig.beta to 0.05 (a reference model
# is loaded). This module cannot import trl to read them: keep in step with the installed TRL.
TRL_DEFAULT_BETA = {"grpo": 0.0, "rloo": 0.05}

# 2.7 / 5.1: CUDA context prior 0.5 GB (0.3-0.6 GB with lazy loading); the CUDA meter measures it into the peak.
CUDA_CONTEXT_BYTES = GiB // 2
# 5.1: reserved/allocated ratio ρ ≈ 1.00-1.15, prior 1.05 (caching allocator rounding, fragmentation). Expandable
# segments avoid most of the slivers (4.2) [V concept]; 1.02 with them is an assumption [A]. The CPU meter counts
# live storages exactly: 1.0.
RESERVED_FACTOR = 1.05
RESERVED_FACTOR_EXPANDABLE = 1.02
ALLOC_ENV = "PYTORCH_ALLOC_CONF"

# The error band of an uncalibrated prediction: the activation coefficient alone spans 8..16 B·h (2.4) and the
# logits/loss costs are version-dependent (2.5) [A].
PRIOR_UNCERTAINTY = 0.25
# With calibration: the largest relative residual of the fitted points, at least this floor [A] ...
CALIBRATED_UNCERTAINTY_FLOOR = 0.03
# ... and with one scale (a single point, fitted exactly, or points at one token count: their residual says nothing
# about other sizes) [A].
SINGLE_POINT_UNCERTAINTY = 0.10

REQUIRED_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
# Attention and MLP modules of a decoder layer (the names PEFT's "all-linear" resolves to on llama/qwen2/gemma3).
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Models whose config class ties the input and output embeddings by default (transformers 5 config classes).
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")
# q/k RMSNorms over head_dim (gemma3, qwen3) and the number of hidden-size norms per decoder layer.
QK_NORM_TYPES = ("gemma3", "gemma3_text", "qwen3", "qwen3_moe", "olmo2")
NORMS_PER_LAYER = {"gemma2": 4, "gemma3": 4, "gemma3_text": 4}
# Qwen2's q/k/v projections always have a bias (modeling_qwen2: bias=True); others follow ``attention_bias``.
QKV_BIAS_TYPES = ("qwen2",)


# ---------------------------------------------------------------------------------------------------------------------
# Shapes and parameter counts
# ---------------------------------------------------------------------------------------------------------------------


def dtype_bytes(name: Any) -> int:
    text = str(name or "").replace("torch.", "").lower()
    return DTYPE_BYTES.get(text, DEFAULT_DTYPE_BYTES)


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    dtype_bytes: int
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    eager_attention: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ModelShape":
        """The shape of a decoder-only model from its HF configuration dict (a nested ``text_config`` is used)."""
        if isinstance(config.get("text_config"), Mapping):  # multimodal wrappers (gemma3): the language model
            config = {**config["text_config"], "torch_dtype": config.get("torch_dtype", config.get("dtype"))}
        missing = [k for k in REQUIRED_CONFIG_KEYS if not config.get(k)]
        if missing:
            raise ValueError(
                f"model config has no {', '.join(missing)}: the memory model supports decoder-only "
                f"llama/qwen2/gemma3-style configurations"
            )
        model_type = str(config.get("model_type", "llama"))
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        head_dim = config.get("head_dim") or hidden // heads
        attention_bias = bool(config.get("attention_bias", False))
        attn = config.get("attn_implementation") or config.get("_attn_implementation") or "sdpa"
        return cls(
            model_type=model_type,
            hidden=hidden,
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)),
            dtype_bytes=dtype_bytes(config.get("torch_dtype") or config.get("dtype")),
            qkv_bias=model_type in QKV_BIAS_TYPES or attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=model_type in QK_NORM_TYPES,
            norms_per_layer=NORMS_PER_LAYER.get(model_type, 2),
            eager_attention=attn == "eager",
        )

    @classmethod
    def from_model(cls, name: str) -> "ModelShape":
        """The shape of a bundled model, a local folder or a cached hub config (see ``autofit.registry``)."""
        from autofit.registry import resolve_model

        return cls.from_config(resolve_model(name).config)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> Dict[str, Tuple[int, int]]:
        """(d_in, d_out) of each linear layer of one decoder layer."""
        h, q, kv, inter = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h),
        }

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelShape":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class ParamCounts:
    per_layer_linear: int  # weights of the 7 linear layers of one decoder layer
    per_layer_other: int  # biases and norms of one decoder layer
    embedding: int
    lm_head: int  # 0 when tied to the embedding (or for a sequence-classification model)
    score_head: int  # reward models: the classification head (h x 1)
    final_norm: int
    layers: int

    @property
    def per_layer(self) -> int:
        return self.per_layer_linear + self.per_layer_other

    @property
    def linear(self) -> int:
        """What bitsandbytes quantizes: the decoder layers' linear weights (not the embedding, not the LM head)."""
        return self.layers * self.per_layer_linear

    @property
    def total(self) -> int:
        return self.layers * self.per_layer + self.embedding + self.lm_head + self.score_head + self.final_norm


def param_counts(shape: ModelShape, algo: str = "sft") -> ParamCounts:
    """Parameter counts as transformers builds them from the config. ``algo="reward"``: a sequence-classification
    model (a score head of h x 1 instead of the LM head). Small terms (norms, biases, gemma3's q/k norms) are
    counted exactly here; they matter for the totals, not for memory."""
    h = shape.hidden
    linear = sum(d_in * d_out for d_in, d_out in shape.linear_shapes().values())
    other = shape.norms_per_layer * h
    if shape.qk_norm:
        other += 2 * shape.head_dim
    if shape.qkv_bias:
        other += shape.q_dim + 2 * shape.kv_dim
    if shape.o_bias:
        other += h
    if shape.mlp_bias:
        other += 2 * shape.intermediate + h
    embedding = shape.vocab * h
    reward = algo == "reward"
    return ParamCounts(
        per_layer_linear=linear,
        per_layer_other=other,
        embedding=embedding,
        lm_head=0 if (shape.tied_embeddings or reward) else embedding,
        score_head=h if reward else 0,
        final_norm=h,
        layers=shape.layers,
    )


def _targets(targets: Any) -> List[str]:
    if targets is None or targets == "all-linear":
        return list(LINEAR_MODULES)
    names = [targets] if isinstance(targets, str) else list(targets)
    unknown = [n for n in names if n not in LINEAR_MODULES]
    if unknown:
        raise ValueError(f"LoRA targets {unknown} are not modelled: accepted are 'all-linear' or {LINEAR_MODULES}")
    return names


def lora_params(shape: ModelShape, r: int, targets: Any = "all-linear") -> int:
    """Trainable LoRA parameters: r·(d_in + d_out) per adapted linear layer, every decoder layer; never the LM head
    (PEFT's "all-linear" excludes the output layer). memory-facts 2.2."""
    linears = shape.linear_shapes()
    return shape.layers * sum(r * (linears[n][0] + linears[n][1]) for n in _targets(targets))


def kv_cache_bytes(shape: ModelShape, batch: int, tokens: int, dtype_bytes: int) -> int:
    """2·L·n_kv·head_dim·tokens·batch·bytes (memory-facts 2.6). Sliding-window layers (gemma3) are counted at full
    length: an upper bound."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * tokens * batch * dtype_bytes


def fused_head_buffer_bytes(tokens: int, compute_bytes: int) -> int:
    """TRL's chunked LM-head matmul buffer: [min(tokens, 4096), 32768] in the compute dtype, whatever the vocab."""
    return min(tokens, FUSED_HEAD_TOKEN_CHUNK) * FUSED_HEAD_VOCAB_CHUNK * compute_bytes if tokens > 0 else 0


class Tensors(NamedTuple):
    """``count`` trainable tensors of ``numel`` elements each; ``embedding``: an nn.Embedding weight."""

    numel: int
    count: int
    embedding: bool = False


def trainable_tensors(shape: ModelShape, candidate: Candidate) -> List[Tensors]:
    """Every trainable tensor, grouped by size: what the gradients and the optimizer states are made of."""
    counts = param_counts(shape, candidate.algo)
    h = shape.hidden
    if candidate.lora is not None:
        linears = shape.linear_shapes()
        tensors = []
        for name in _targets(candidate.lora.target_modules):
            d_in, d_out = linears[name]
            tensors += [(candidate.lora.r * d_in, shape.layers), (candidate.lora.r * d_out, shape.layers)]
        if counts.score_head:  # PEFT SEQ_CLS: the score head is trained too (modules_to_save)
            tensors.append((counts.score_head, 1))
        return [Tensors(*t) for t in tensors]
    tensors = [(d_in * d_out, shape.layers) for d_in, d_out in shape.linear_shapes().values()]
    tensors.append((h, shape.layers * shape.norms_per_layer))
    if shape.qk_norm:
        tensors.append((shape.head_dim, 2 * shape.layers))
    if shape.qkv_bias:
        tensors += [(shape.q_dim, shape.layers), (shape.kv_dim, 2 * shape.layers)]
    if shape.o_bias:
        tensors.append((h, shape.layers))
    if shape.mlp_bias:
        tensors += [(shape.intermediate, 2 * shape.layers), (h, shape.layers)]
    tensors += [(counts.embedding, 1, True), (h, 1)]
    if counts.lm_head:
        tensors.append((counts.lm_head, 1))
    if counts.score_head:
        tensors.append((counts.score_head, 1))
    return [Tensors(*t) for t in tensors]


def optimizer_state_bytes(tensors: Iterable[Any], optim: Optional[str], param_bytes: int) -> float:
    """Optimizer state bytes for trainable tensors given as ``Tensors`` or (numel, count) (memory-facts 2.1).
    ``optim=None`` is TRL's default (fused torch AdamW): 2 states in the parameter's dtype."""
    name = optim or TRL_DEFAULT_OPTIM
    total = 0.0
    for item in tensors:
        numel, count, embedding = (tuple(item) + (False,))[:3]
        if name in EIGHT_BIT_OPTIMS:
            if numel >= BNB_MIN_8BIT_SIZE and not (embedding and BNB_EMBEDDING_32BIT):
                per = BNB_8BIT_BYTES_PER_PARAM + BNB_BLOCKWISE_ABSMAX_BYTES
            else:
                per = ADAMW_STATES * BNB_32BIT_STATE_BYTES
        elif name in ADAMW_OPTIMS or name.startswith("adamw"):
            per = ADAMW_STATES * param_bytes
        elif name.startswith("adafactor"):
            per = ADAFACTOR_BYTES_PER_PARAM
        elif name == "sgd":
            per = SGD_BYTES_PER_PARAM
        else:
            per = UNKNOWN_OPTIM_BYTES_PER_PARAM
        total += per * numel * count
    return total


def optimizer_step_temporary_bytes(tensors: Iterable[Any], optim: Optional[str], param_bytes: int) -> int:
    """Temporaries of the optimizer step: the foreach AdamW path (``adamw_torch``) allocates one full-size state copy."""
    if (optim or TRL_DEFAULT_OPTIM) in ("adamw_torch", "adamw_hf"):
        return FOREACH_TEMPORARY_COPIES * param_bytes * sum(t[0] * t[1] for t in tensors)
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# The ledger
# ---------------------------------------------------------------------------------------------------------------------

STATIC_TERMS = ("weights", "gradients", "optimizer", "reference", "cuda_context")
DYNAMIC_TERMS = ("activations", "logits", "generation")
TERMS = ("weights", "gradients", "optimizer", "activations", "logits", "generation", "reference", "allocator",
         "cuda_context")
TERM_HELP = {
    "weights": "model weights (quantized linears at 0.516/1 B, adapters, autocast copy, dequant transient)",
    "gradients": "gradients of the trainable parameters (resident in forward when grad_accum >= 2)",
    "optimizer": "optimizer states (+ the step's temporaries in the step phase)",
    "activations": "activations saved for backward (checkpointing keeps layer inputs)",
    "logits": "TRL's fused LM-head buffer, fp32 hidden/LM-head gradient accumulators",
    "generation": "grpo/rloo generation: KV cache, per-step logits, prefill",
    "reference": "frozen reference model (beta > 0 without LoRA)",
    "allocator": "caching allocator overhead (reserved - allocated)",
    "cuda_context": "CUDA context",
}


@dataclass(frozen=True)
class Ledger:
    """Bytes live at the predicted peak, by term; ``total`` is their sum. ``phase`` names the peak phase and
    ``phase_totals`` gives every phase's total. ``uncertainty`` is the relative error band (0.25 = ±25 %)."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    logits: float = 0.0
    generation: float = 0.0
    reference: float = 0.0
    allocator: float = 0.0
    cuda_context: float = 0.0
    phase: str = "train"
    phase_totals: Dict[str, float] = field(default_factory=dict)
    uncertainty: float = PRIOR_UNCERTAINTY
    reserved_factor: float = 1.0

    @property
    def total(self) -> float:
        return sum(getattr(self, name) for name in TERMS)

    @property
    def static(self) -> float:
        """What does not depend on the tokens (its allocator share included): what the static scale multiplies."""
        return self.reserved_factor * sum(getattr(self, n) for n in STATIC_TERMS if n != "cuda_context") + self.cuda_context

    @property
    def dynamic(self) -> float:
        """Activations, LM-head buffers, generation (allocator share included): what the dynamic scale multiplies."""
        return self.reserved_factor * sum(getattr(self, n) for n in DYNAMIC_TERMS)

    @property
    def low(self) -> float:
        return self.total * (1 - self.uncertainty)

    @property
    def high(self) -> float:
        return self.total * (1 + self.uncertainty)

    def fits(self, budget_bytes: float) -> bool:
        """The point prediction is within the budget."""
        return self.total <= budget_bytes

    def verdict(self, budget_bytes: float) -> str:
        """"yes" when even the high end of the band fits, "no" when even the low end does not, else "maybe"."""
        if self.high <= budget_bytes:
            return "yes"
        if self.low > budget_bytes:
            return "no"
        return "maybe"

    def terms(self) -> Dict[str, float]:
        return {name: getattr(self, name) for name in TERMS}

    def scaled(self, static_scale: float, dynamic_scale: float, uncertainty: float) -> "Ledger":
        """This ledger with the static and dynamic terms scaled (calibration)."""
        changes = {n: getattr(self, n) * static_scale for n in STATIC_TERMS}
        changes.update({n: getattr(self, n) * dynamic_scale for n in DYNAMIC_TERMS})
        torch_part = sum(changes[n] for n in TERMS if n in changes and n != "cuda_context")
        changes["allocator"] = (self.reserved_factor - 1) * torch_part
        return replace(self, uncertainty=uncertainty, **changes)


@dataclass(frozen=True)
class _Phase:
    name: str
    terms: Dict[str, float]


def _beta(candidate: Candidate) -> float:
    args = dict(candidate.user_args)
    if "beta" in args and args["beta"] is not None:
        return float(args["beta"])
    return TRL_DEFAULT_BETA.get(candidate.algo, 0.0)


def weight_bytes(candidate: Candidate, shape: ModelShape) -> int:
    """Bytes per parameter of the loaded (non-quantized) weights: ``model_init_kwargs["dtype"]`` from the user's
    arguments, else TRL's default (float32); "auto" or None: the configuration's dtype."""
    init = dict(candidate.user_args).get("model_init_kwargs") or {}
    dtype = init.get("dtype", init.get("torch_dtype", TRL_DEFAULT_LOAD_DTYPE)) if isinstance(init, Mapping) \
        else TRL_DEFAULT_LOAD_DTYPE
    if dtype is None or str(dtype) == "auto":
        return shape.dtype_bytes
    return dtype_bytes(dtype)


def compute_bytes(candidate: Candidate, shape: ModelShape, device: str) -> int:
    """Bytes per activation element: bf16 autocast on CUDA (TRL's ``bf16=True``); the weights' dtype on the CPU."""
    return CUDA_COMPUTE_BYTES if device == "cuda" else weight_bytes(candidate, shape)


def sequence_length(candidate: Candidate) -> int:
    """Tokens of one training sequence: RL trains on prompt + completion."""
    if candidate.is_rl:
        return (candidate.prompt_length or DEFAULT_PROMPT_LENGTH) + candidate.max_length
    return candidate.max_length


def sequences_per_micro_batch(candidate: Candidate) -> int:
    """The reward trainer concatenates the chosen and the rejected sides: 2 sequences per example."""
    return 2 * candidate.micro_batch if candidate.algo == "reward" else candidate.micro_batch


def train_tokens(candidate: Candidate) -> int:
    return sequences_per_micro_batch(candidate) * sequence_length(candidate)


def logit_tokens(candidate: Candidate, device: str) -> int:
    """Positions the fused LM head scores: shifted labels; RL on CUDA scores only the completion (compact path),
    on the CPU every position (trl-facts). The reward model has no LM head."""
    if candidate.algo == "reward":
        return 0
    if candidate.is_rl and device == "cuda":
        return candidate.micro_batch * candidate.max_length
    return candidate.micro_batch * (sequence_length(candidate) - 1)


def generation_batch(candidate: Candidate) -> int:
    """TRL: generation_batch_size = per_device_train_batch_size x steps_per_generation (default grad_accum)."""
    args = dict(candidate.user_args)
    if args.get("generation_batch_size"):
        return int(args["generation_batch_size"])
    return candidate.micro_batch * int(args.get("steps_per_generation") or candidate.grad_accum)


def activation_bytes_per_token_layer(shape: ModelShape, act_bytes: int, lora: Optional[LoraSettings] = None) -> float:
    """Bytes saved for backward per token per decoder layer without checkpointing (memory-facts 2.4)."""
    scale = act_bytes / 2  # the coefficients are bytes at 2-byte activations
    norm_elems = shape.norms_per_layer * shape.hidden + (shape.q_dim + shape.kv_dim if shape.qk_norm else 0)
    per = (ACT_NORM_BYTES * norm_elems + ACT_Q_AND_ATTN_OUT_BYTES * shape.q_dim + ACT_KV_BYTES * shape.kv_dim
           + ACT_MLP_BYTES * shape.intermediate)
    if lora is not None and lora.dropout > 0:
        linears = shape.linear_shapes()
        inputs = sum(linears[n][0] for n in _targets(lora.target_modules))  # 6h + I for all-linear
        per += LORA_DROPOUT_BYTES_PER_ELEMENT * inputs
    return per * scale


def _phases(candidate: Candidate, shape: ModelShape, device: str) -> List[_Phase]:
    counts = param_counts(shape, candidate.algo)
    w_bytes = weight_bytes(candidate, shape)
    act_bytes = compute_bytes(candidate, shape, device)
    lora = candidate.lora
    quant = candidate.quantization

    # -- weights (2.1, 2.3) ------------------------------------------------------------------------------------
    if quant == "4bit":
        weights = counts.linear * NF4_BYTES_PER_PARAM + (counts.total - counts.linear) * w_bytes
    elif quant == "8bit":
        weights = counts.linear * INT8_BYTES_PER_PARAM + (counts.total - counts.linear) * w_bytes
    else:
        weights = counts.total * w_bytes
    if quant is not None:
        largest = max(d_in * d_out for d_in, d_out in shape.linear_shapes().values())
        weights += DEQUANT_TRANSIENT_LAYERS * largest * act_bytes
    tensors = trainable_tensors(shape, candidate)
    trainable = sum(t.numel * t.count for t in tensors)
    if lora is not None:
        t_bytes = QLORA_ADAPTER_BYTES if quant is not None else max(LORA_ADAPTER_BYTES, w_bytes)
        weights += trainable * t_bytes  # the adapters (and a reward model's score head) on top of the base
    else:
        t_bytes = w_bytes
    autocast_copy = 0.0
    if device == "cuda" and t_bytes == 4:  # fp32 trainable weights under bf16 autocast: a cached bf16 copy
        autocast_copy = AUTOCAST_WEIGHT_COPY_BYTES * (counts.linear if lora is None else trainable)

    # -- gradients and optimizer (2.1) -------------------------------------------------------------------------
    gradients = trainable * t_bytes
    optimizer = optimizer_state_bytes(tensors, candidate.optim, t_bytes)
    step_temporaries = optimizer_step_temporary_bytes(tensors, candidate.optim, t_bytes)

    # The end of the backward: with a trained, tied embedding, the LM head's gradient is already in ``.grad`` when
    # the embedding's backward returns its own (a new [V, h]) and the accumulation adds them (another) [V: measured
    # on the CPU meter, Qwen2.5-0.5B: +2 x V·h x 4 B over weights + gradients + AdamW].
    embedding_temporaries = 0.0
    if lora is None and shape.tied_embeddings and candidate.algo != "reward":
        embedding_temporaries = TIED_EMBEDDING_GRAD_COPIES * counts.embedding * t_bytes

    # -- reference model (2.6): beta > 0 and no PEFT; reloaded from the path in the same dtype --------------------
    reference = counts.total * w_bytes if candidate.is_rl and _beta(candidate) > 0 and lora is None else 0.0

    # -- activations (2.4) -------------------------------------------------------------------------------------
    # Two moments of the forward/backward: "train", the LM head's backward (every saved activation and the head's
    # buffers), and "backward", a decoder layer's backward (its gradient temporaries; with checkpointing, the
    # recomputed layer too) once the head's buffers are gone.
    tokens = train_tokens(candidate)
    per_layer = activation_bytes_per_token_layer(shape, act_bytes, lora)
    outside = ACT_OUTSIDE_LAYERS_BYTES_PER_H * shape.hidden * act_bytes / 2
    if candidate.checkpointing:
        saved = tokens * (shape.layers * shape.hidden * act_bytes + outside)
        layer_moment = saved + tokens * CKPT_LIVE_LAYERS * per_layer
    else:
        saved = tokens * (shape.layers * per_layer + outside)
        layer_moment = saved + tokens * BACKWARD_TEMP_LAYERS * per_layer
    if shape.eager_attention:
        seq = sequence_length(candidate)
        scores = EAGER_SCORE_BYTES * act_bytes / 2 * shape.heads * seq * seq * sequences_per_micro_batch(candidate)
        if candidate.checkpointing:
            layer_moment += scores  # only the recomputed layer's scores
        else:
            saved += scores * shape.layers
            layer_moment += scores * shape.layers

    # -- the LM head and the loss (2.5, trl-facts fused LM head) -----------------------------------------------
    n_logit = logit_tokens(candidate, device)
    logits = 0.0
    if n_logit:
        logits = fused_head_buffer_bytes(n_logit, act_bytes)
        logits += n_logit * shape.hidden * FUSED_HEAD_GRAD_ACCUM_BYTES  # fp32 grad of the hidden states
        # The LM head (or the tied embedding) is trained: an fp32 weight-gradient accumulator, cast at the end.
        cast_copy = 0.0
        if lora is None:
            logits += shape.vocab * shape.hidden * FUSED_HEAD_GRAD_ACCUM_BYTES
            cast_copy = shape.vocab * shape.hidden * w_bytes
        tile_temporaries = 0.0
        if device != "cuda":  # no Triton: the torch fallback's whole-tile temporaries (freed before the cast)
            tile = min(n_logit, FUSED_HEAD_TOKEN_CHUNK) * min(shape.vocab, FUSED_HEAD_VOCAB_CHUNK)
            tile_temporaries = tile * FUSED_HEAD_TORCH_TILE_BYTES
        logits += max(tile_temporaries, cast_copy)

    static = {"weights": weights + autocast_copy, "reference": reference, "optimizer": optimizer,
              "gradients": gradients if candidate.grad_accum >= 2 else 0.0}
    phases = [
        _Phase("train", {**static, "activations": saved, "logits": logits}),
        _Phase("backward", {**static, "activations": layer_moment}),
        _Phase("step", {"weights": weights, "reference": reference, "gradients": gradients,
                        "optimizer": optimizer + max(step_temporaries, embedding_temporaries)}),
    ]

    # -- generation (2.6) --------------------------------------------------------------------------------------
    if candidate.is_rl:
        batch = generation_batch(candidate)
        prompt = candidate.prompt_length or DEFAULT_PROMPT_LENGTH
        generation = kv_cache_bytes(shape, batch, prompt + candidate.max_length, act_bytes)
        generation += batch * shape.vocab * GEN_LOGITS_BYTES * GEN_LOGITS_COPIES
        generation += batch * prompt * act_bytes * (
            GEN_PREFILL_MLP_COPIES * shape.intermediate + GEN_PREFILL_HIDDEN_COPIES * shape.hidden)
        phases.append(_Phase("generation", {"weights": weights, "reference": reference, "optimizer": optimizer,
                                            "generation": generation}))
    return phases


def _reserved_factor(candidate: Candidate, device: str) -> float:
    if device != "cuda":
        return 1.0
    if "expandable_segments:True" in dict(candidate.env).get(ALLOC_ENV, ""):
        return RESERVED_FACTOR_EXPANDABLE
    return RESERVED_FACTOR


def _ledger(phase: _Phase, rho: float, context: float, totals: Dict[str, float], uncertainty: float) -> Ledger:
    terms = {name: float(value) for name, value in phase.terms.items()}
    torch_part = sum(terms.values())
    return Ledger(**terms, allocator=(rho - 1) * torch_part, cuda_context=context, phase=phase.name,
                  phase_totals=totals, uncertainty=uncertainty, reserved_factor=rho)


def phase_ledgers(candidate: Candidate, shape: Optional[ModelShape] = None, *, device: Optional[str] = None
                  ) -> List[Ledger]:
    """One uncalibrated ledger per phase (train, step, and generation for grpo/rloo)."""
    shape = shape or ModelShape.from_model(candidate.model)
    device = device or candidate.device
    rho = _reserved_factor(candidate, device)
    context = CUDA_CONTEXT_BYTES if device == "cuda" else 0
    phases = _phases(candidate, shape, device)
    totals = {p.name: rho * sum(p.terms.values()) + context for p in phases}
    return [_ledger(p, rho, context, totals, PRIOR_UNCERTAINTY) for p in phases]


def predict(candidate: Candidate, shape: Optional[ModelShape] = None, *, device: Optional[str] = None) -> Ledger:
    """The uncalibrated ledger at the predicted peak phase. ``shape`` defaults to the candidate's model config,
    ``device`` to the candidate's device ("cuda": bf16 autocast, CUDA context, allocator overhead)."""
    return max(phase_ledgers(candidate, shape, device=device), key=lambda ledger: ledger.total)


# ---------------------------------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Calibration:
    """Scales fitted on measured probes: calibrated peak = static_scale·static + dynamic_scale·dynamic, per phase.

    ``method`` is "prior" (no points: scales 1), "scale" (one scale on everything: one point, or points that cannot
    separate the two parts) or "two-term" (least squares on two or more points at different token counts).
    The calibration belongs to one model, algorithm and device; ``shape`` is kept so it needs no registry."""

    static_scale: float = 1.0
    dynamic_scale: float = 1.0
    method: str = "prior"
    points: int = 0
    max_residual: float = 0.0  # the largest |predicted - measured| / measured over the fitted points
    model: Optional[str] = None
    algo: Optional[str] = None
    device: Optional[str] = None
    shape: Optional[ModelShape] = None

    @property
    def uncertainty(self) -> float:
        if self.points == 0:
            return PRIOR_UNCERTAINTY
        if self.method != "two-term":  # one scale: a single point, or points at one token count
            return max(SINGLE_POINT_UNCERTAINTY, self.max_residual)
        return max(CALIBRATED_UNCERTAINTY_FLOOR, self.max_residual)

    def applies_to(self, candidate: Candidate) -> bool:
        return all(mine is None or mine == theirs for mine, theirs in
                   ((self.model, candidate.model), (self.algo, candidate.algo), (self.device, candidate.device)))

    def predict_calibrated(self, candidate: Candidate, *, device: Optional[str] = None) -> Ledger:
        """The calibrated ledger at the peak phase (phases compared after scaling)."""
        ledgers = phase_ledgers(candidate, self.shape, device=device)
        scaled = [self._scale(ledger) for ledger in ledgers]
        totals = {ledger.phase: ledger.total for ledger in scaled}
        return replace(max(scaled, key=lambda ledger: ledger.total), phase_totals=totals)

    def _scale(self, ledger: Ledger) -> Ledger:
        return ledger.scaled(self.static_scale, self.dynamic_scale, self.uncertainty)

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["shape"] = self.shape.to_dict() if self.shape is not None else None
        data["uncertainty"] = self.uncertainty  # informative; recomputed on load
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Calibration":
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if values.get("shape") is not None:
            values["shape"] = ModelShape.from_dict(values["shape"])
        return cls(**values)


def _solve(parts: Sequence[Tuple[float, float]], measured: Sequence[float]) -> Optional[Tuple[float, float]]:
    """Weighted least squares (weights 1/y², i.e. relative errors) for y ≈ a·S + b·D; None if degenerate."""
    sss = ssd = sdd = ssy = sdy = 0.0
    for (s, d), y in zip(parts, measured):
        w = 1.0 / (y * y)
        sss += w * s * s
        ssd += w * s * d
        sdd += w * d * d
        ssy += w * s * y
        sdy += w * d * y
    det = sss * sdd - ssd * ssd
    if det <= 1e-12 * max(sss * sdd, 1e-300):  # the points do not separate the two parts
        return None
    a = (ssy * sdd - sdy * ssd) / det
    b = (sss * sdy - ssd * ssy) / det
    return (a, b) if a > 0 and b > 0 else None


def calibrate(points: Sequence[Tuple[Candidate, float]], shape: Optional[ModelShape] = None, *,
              device: Optional[str] = None) -> Calibration:
    """Fit the static and dynamic scales on measured (candidate, peak bytes) points of one model/algo/device.

    Each point is decomposed at its peak phase (chosen again with the fitted scales until it is stable). Points at
    two or more token counts fit both scales; otherwise one scale is fitted. (Two points at the same token count,
    checkpointing on and off say, differ in their dynamic part only by the ledger's recomputation model: a
    two-term fit on them extrapolates that model's error to every other size, 9% off in the benchmark.)"""
    points = [(c, float(y)) for c, y in points if y and y > 0]
    if not points:
        return Calibration(shape=shape)
    first = points[0][0]
    shape = shape or ModelShape.from_model(first.model)
    phases = [phase_ledgers(c, shape, device=device) for c, _ in points]
    measured = [y for _, y in points]
    a = b = 1.0
    method = "scale"
    for _ in range(4):
        chosen = [max(ledgers, key=lambda l: a * l.static + b * l.dynamic) for ledgers in phases]
        parts = [(l.static, l.dynamic) for l in chosen]
        solved = _solve(parts, measured) if len({train_tokens(c) for c, _ in points}) >= 2 else None
        if solved is not None:
            new, method = solved, "two-term"
        else:  # one scale on the whole prediction
            totals = [s + d for s, d in parts]
            k = sum(p / y for p, y in zip(totals, measured)) / sum((p / y) ** 2 for p, y in zip(totals, measured))
            new, method = (k, k), "scale"
        if abs(new[0] - a) <= 1e-12 * a and abs(new[1] - b) <= 1e-12 * b:
            break
        a, b = new
    fitted = [max(a * l.static + b * l.dynamic for l in ledgers) for ledgers in phases]
    residual = max(abs(p - y) / y for p, y in zip(fitted, measured))
    devices = {device or c.device for c, _ in points}
    return Calibration(
        static_scale=a, dynamic_scale=b, method=method, points=len(points), max_residual=residual,
        model=first.model, algo=first.algo, device=devices.pop() if len(devices) == 1 else None, shape=shape,
    )


def predict_calibrated(candidate: Candidate, calibration: Optional[Calibration] = None,
                       shape: Optional[ModelShape] = None) -> Ledger:
    """The calibrated ledger when ``calibration`` applies to the candidate, else the prior's."""
    if calibration is None or calibration.points == 0 or not calibration.applies_to(candidate):
        return predict(candidate, shape)
    if calibration.shape is None:
        calibration = replace(calibration, shape=shape or ModelShape.from_model(candidate.model))
    return calibration.predict_calibrated(candidate)


# ---------------------------------------------------------------------------------------------------------------------
# Which rung the model expects to be needed
# ---------------------------------------------------------------------------------------------------------------------


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def length_grid(low: int, high: int) -> List[int]:
    """The search's grid of sequence lengths from ``low`` to ``high``: multiples of a step that keeps about 64
    points (``autofit.search`` uses it too)."""
    step = max(8, 2 ** int(math.log2(max(high, 8) / 64))) if high > low else 1
    inner = range((low // step + 1) * step, high, step)
    return sorted({low, *inner, high})


def base_candidate(spec: Any) -> Candidate:
    """The ladder's starting point for a ``SearchSpec``-like object, as the search builds it: micro-batch = the
    effective batch, no accumulation, full length, checkpointing off."""
    return Candidate(
        algo=spec.algo,
        model=spec.model,
        device=spec.device,
        micro_batch=spec.effective_batch,
        grad_accum=1,
        max_length=spec.max_length,
        user_args=tuple(sorted(dict(getattr(spec, "user_args", None) or {}).items())),
        real_weights=getattr(spec, "real_weights", False),
        num_generations=getattr(spec, "num_generations", None),
        prompt_length=getattr(spec, "prompt_length", None) if spec.algo in RL_ALGOS else None,
    )


@dataclass
class LevelEstimate:
    level: int
    rungs: Tuple[str, ...]
    cost: str
    candidate: Candidate  # the largest micro-batch (or longest length) predicted to fit; else the smallest tried
    ledger: Ledger
    fits: bool  # point prediction within the budget


@dataclass
class RungEstimate:
    budget_bytes: int
    levels: List[LevelEstimate]
    expected: Optional[LevelEstimate]  # the first level predicted to fit; None: nothing is predicted to fit

    @property
    def rungs(self) -> Optional[Tuple[str, ...]]:
        return self.expected.rungs if self.expected is not None else None

    @property
    def rung(self) -> Optional[str]:
        """The rung the model expects to be needed first ("baseline" when none is; None when nothing fits)."""
        if self.expected is None:
            return None
        return self.expected.rungs[-1] if self.expected.rungs else "baseline"


def _predictor(calibration: Optional[Calibration], shape: ModelShape):
    def at(candidate: Candidate) -> Ledger:
        return predict_calibrated(candidate, calibration, shape)

    return at


def _best_at_level(state, spec: Any, budget: int, predict_at) -> Tuple[Candidate, Ledger, bool]:
    effective = spec.effective_batch
    batches = divisors(effective) if state.vary_batch else [effective]
    min_length = getattr(spec, "min_length", None) or spec.max_length
    maximize = getattr(spec, "maximize", "batch")

    def at(batch: int, length: int) -> Candidate:
        return state.candidate.replace(micro_batch=batch, grad_accum=effective // batch, max_length=length)

    def scan(pairs: Iterable[Tuple[int, int]]) -> Optional[Tuple[Candidate, Ledger]]:
        for batch, length in pairs:  # largest first
            candidate = at(batch, length)
            ledger = predict_at(candidate)
            if ledger.fits(budget):
                return candidate, ledger
        return None

    if maximize == "length":
        found = scan((batches[0], n) for n in reversed(length_grid(min_length, spec.max_length)))
    else:
        found = scan((b, spec.max_length) for b in reversed(batches))
        if found is None and state.vary_length:
            found = scan((b, n) for n in reversed(length_grid(min_length, spec.max_length)[:-1])
                         for b in reversed(batches))
    if found is not None:
        return found[0], found[1], True
    smallest = at(batches[0], min_length if (state.vary_length or maximize == "length") else spec.max_length)
    return smallest, predict_at(smallest), False


def expected_rung(spec: Any, budget_bytes: Optional[int] = None, *, calibration: Optional[Calibration] = None,
                  shape: Optional[ModelShape] = None, rungs: Optional[Sequence[Any]] = None) -> RungEstimate:
    """Walk the ladder (``spec.ladder`` or the default order) over predicted peaks: at each level the largest
    divisor of the effective batch predicted to fit (shorter lengths once that rung is on, or the longest length
    with ``maximize="length"``); the first level with a fit is the rung the model expects to be needed.
    ``spec`` is a ``SearchSpec`` or any object with its fields (model, algo, device, effective_batch,
    max_length, min_length, maximize, num_generations, prompt_length, user_args, ladder)."""
    from autofit.ladder import LadderState, climb, resolve_ladder

    budget = budget_bytes if budget_bytes is not None else spec.budget_bytes
    if budget is None:
        raise ValueError("expected_rung needs a budget")
    shape = shape or (calibration.shape if calibration is not None and calibration.shape is not None else None) \
        or ModelShape.from_model(spec.model)
    rungs = list(rungs) if rungs is not None else resolve_ladder(getattr(spec, "ladder", None))
    start = LadderState(base_candidate(spec), min_length=getattr(spec, "min_length", None) or spec.max_length,
                        maximize=getattr(spec, "maximize", "batch"))
    predict_at = _predictor(calibration, shape)
    levels = []
    for index, state in enumerate(climb(start, rungs)):
        candidate, ledger, fits = _best_at_level(state, spec, budget, predict_at)
        levels.append(LevelEstimate(index, tuple(state.rungs), state.cost, candidate, ledger, fits))
    expected = next((level for level in levels if level.fits), None)
    return RungEstimate(budget, levels, expected)
