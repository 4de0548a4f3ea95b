"""Weights, gradients and optimizer states: what the trainable and frozen parameters cost (memory-facts 2.1-2.3).

Parameter counts come from the model's census (``census``: counted from the model built by transformers, or from the
configuration's sizes); this package never imports torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, NamedTuple, Optional

from autofit.core import ALGORITHMS, DEFAULT_ALGO, Candidate, algorithm, user_dtype
from autofit.memory_model._census import Census, lora_tensors
from autofit.memory_model._shape import ModelShape, dtype_bytes

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
# 2.3 without nested quantization (``use_bnb_nested_quant: false``, TRL's default): 4 bits + one fp32 absmax per
# block of 64 weights = 0.5625 B/param [D: bitsandbytes' 4-bit blocksize 64]. The storage dtype
# (``bnb_4bit_quant_storage``: uint8, or bf16 as QLoRA under FSDP packs it) holds the same packed bytes.
NF4_PLAIN_BYTES_PER_PARAM = 0.5 + 4 / 64
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
# One state per parameter: Lion's momentum (bitsandbytes' 32-bit Lion keeps it in fp32), RMSprop's square average
# and Adagrad's sum, in the parameter's dtype for torch's [V: the optimizers' state definitions].
ONE_STATE_FP32 = ("lion_32bit", "paged_lion_32bit", "rmsprop_bnb_32bit", "rmsprop_bnb")
ONE_STATE = ("rmsprop", "adagrad")
# 2.1: the foreach (multi-tensor) AdamW path allocates full-size temporaries (``torch._foreach_sqrt(exp_avg_sqs)``,
# TRL PR #2776): one copy of a state. The fused path (TRL's default ``adamw_torch_fused``) has none [V].
FOREACH_TEMPORARY_COPIES = 1
TIED_EMBEDDING_GRAD_COPIES = 2  # see the "step" phase: end of the backward with tied, trained embeddings
TRL_DEFAULT_OPTIM = "adamw_torch_fused"  # trl-facts table: SFTConfig/GRPOConfig/RLOOConfig ``optim`` default
EIGHT_BIT_OPTIMS = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "adamw_torch_8bit", "lion_8bit",
                    "paged_lion_8bit", "ademamix_8bit", "paged_ademamix_8bit", "rmsprop_bnb_8bit")
ADAMW_OPTIMS = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "paged_adamw_32bit", "adamw_apex_fused",
                "adamw_anyprecision", "adamw_torch_xla", "adamw_torch_npu_fused", "stable_adamw", "ademamix")
# transformers' names of bitsandbytes' 32-bit optimizers beside the 8-bit ones (``adamw_torch_8bit`` is torchao's)
BNB_32BIT_OPTIMS = ("lion_32bit", "ademamix", "rmsprop_bnb", "rmsprop_bnb_32bit")
UNKNOWN_OPTIM_BYTES_PER_PARAM = 8.0  # an optimizer this table does not know: two fp32 states, conservative [A]
# 2.6 / trl-facts table: GRPOConfig.beta defaults to 0.0 (no reference model), RLOOConfig.beta to 0.05 (a reference
# model is loaded): the registry's ``default_beta``. This module cannot import trl to read them: keep in step with the
# installed TRL.
TRL_DEFAULT_BETA = {a.name: a.default_beta for a in ALGORITHMS.values() if a.default_beta is not None}


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by what the memory terms treat differently. ``linear``: what bitsandbytes quantizes (nn.Linear
    layers but the output layer); ``experts``: fused mixture-of-experts tensors (never quantized; peft's all-linear
    adapts them, ``_census``)."""

    total: int
    linear: int
    embedding: int
    lm_head: int  # 0 when tied to the embedding (or for a sequence-classification model)
    score_head: int  # reward models: the classification head (h x 1)
    experts: int = 0


def census_for(shape: ModelShape, algo: str = DEFAULT_ALGO) -> Census:
    """The parameters of the model ``algo`` trains: the causal LM, or a reward model's sequence classifier."""
    return shape.parameters().for_algo(algo)


def param_counts(shape: ModelShape, algo: str = DEFAULT_ALGO) -> ParamCounts:
    """Parameter counts as transformers builds the model (a sequence classifier's algorithm: a score head of h x 1
    instead of the LM head), from the census (``ModelShape.parameters``)."""
    census = census_for(shape, algo)
    reward = algorithm(algo).sequence_classifier
    return ParamCounts(total=census.total, linear=census.quantized, embedding=census.embedding,
                       lm_head=0 if reward else census.head, score_head=census.head if reward else 0,
                       experts=census.experts)


def lora_params(shape: ModelShape, r: int, targets: Any = "all-linear", algo: str = DEFAULT_ALGO) -> int:
    """Trainable LoRA adapter parameters: r·(d_in + d_out) per adapted linear layer (peft's rule, see ``census``);
    "all-linear" never adapts the output layer. memory-facts 2.2."""
    return sum(r * (g.d_in + g.d_out) * g.count for g in census_for(shape, algo).lora_modules(targets))


class Tensors(NamedTuple):
    """``count`` trainable tensors of ``numel`` elements each; ``embedding``: an nn.Embedding weight."""

    numel: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, which no caller uses
    embedding: bool = False


def trainable_tensors(shape: ModelShape, candidate: Candidate) -> List[Tensors]:
    """Every trainable tensor, grouped by size: what the gradients and the optimizer states are made of."""
    census = census_for(shape, candidate.algo)
    if candidate.lora is not None:
        adapters = lora_tensors(census, candidate.lora.r, candidate.lora.target_modules)
        return [Tensors(n, c) for n, c in adapters] + saved_tensors(shape, candidate)
    return [Tensors(p.numel, p.count, p.kind == "embedding") for p in census.params]


def head_trained(candidate: Candidate) -> bool:
    """Whether the LM head (or the tied embedding) is trained: a full fine-tune, or LoRA with ``lm_head`` in
    ``lora_modules_to_save`` (TRL's fused head then accumulates its weight's gradient as for a full fine-tune [V: CPU
    meter, tiny-qwen2, +V·h·4 B])."""
    return candidate.lora is None or "lm_head" in candidate.lora.modules_to_save


def saved_tensors(shape: ModelShape, candidate: Candidate) -> List[Tensors]:
    """The modules ModelConfig's ``lora_modules_to_save`` names, trained whole beside the adapters: peft's trained
    copy of each (its weights, gradients and optimizer states are the module's size, in the weights' dtype)."""
    if candidate.lora is None or not candidate.lora.modules_to_save:
        return []
    census = census_for(shape, candidate.algo)
    own = census.modules_to_save()  # a reward model's score head: counted with the adapters
    return [Tensors(p.numel, p.count, p.kind == "embedding")
            for p in census.modules_to_save(candidate.lora.modules_to_save) if p not in own]


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
        elif name in ONE_STATE_FP32:
            per = BNB_32BIT_STATE_BYTES
        elif name in ONE_STATE:
            per = param_bytes
        else:
            per = UNKNOWN_OPTIM_BYTES_PER_PARAM
        total += per * numel * count
    return total


def optimizer_known(optim: Optional[str]) -> bool:
    """Whether ``optimizer_state_bytes`` describes this optimizer (else it assumes two fp32 states)."""
    name = optim or TRL_DEFAULT_OPTIM
    return (name in EIGHT_BIT_OPTIMS or name in ADAMW_OPTIMS or name.startswith(("adamw", "adafactor"))
            or name in ("sgd", *ONE_STATE_FP32, *ONE_STATE))


def optimizer_step_temporary_bytes(tensors: Iterable[Any], optim: Optional[str], param_bytes: int) -> int:
    """Temporaries of the optimizer step: the foreach AdamW path (``adamw_torch``) allocates one full-size state
    copy."""
    if (optim or TRL_DEFAULT_OPTIM) in ("adamw_torch", "adamw_hf"):
        return int(FOREACH_TEMPORARY_COPIES * param_bytes * sum(t[0] * t[1] for t in tensors))
    return 0


def holds_reference(candidate: Candidate) -> bool:
    """Whether the trainer holds a reference model: its unit has one (``models``), its KL coefficient is > 0, no LoRA
    (the policy with its adapter off is the reference then) and its log-probs are not precomputed."""
    return ("reference" in candidate.unit.models and _beta(candidate) > 0 and candidate.lora is None
            and not candidate.precompute_ref)


def _beta(candidate: Candidate) -> float:
    args = dict(candidate.user_args)
    if "beta" in args and args["beta"] is not None:
        return float(args["beta"])
    return TRL_DEFAULT_BETA.get(candidate.algo, 0.0)


def weight_bytes(candidate: Candidate, shape: ModelShape) -> int:
    """Bytes per parameter of the loaded (non-quantized) weights: the candidate's dtype (the bf16-weights rung,
    ``--dtype``), else ``model_init_kwargs["dtype"]`` from the user's arguments, else TRL's default (float32);
    "auto" or None: the configuration's dtype."""
    default = candidate.unit.load_dtype  # TRL_DEFAULT_LOAD_DTYPE, or "auto" where the models are from_pretrained's
    dtype: Optional[str] = user_dtype(candidate.user_args) or default
    if candidate.dtype is not None:
        dtype = candidate.dtype
    if dtype is None or str(dtype) == "auto":
        return shape.dtype_bytes
    return dtype_bytes(dtype)


def four_bit_bytes(candidate: Candidate) -> float:
    """Bytes per quantized weight of a 4-bit base: with nested quantization (the rung's, or the file's
    ``use_bnb_nested_quant: true``) or without (TRL's default); nf4 and fp4 take the same."""
    return NF4_BYTES_PER_PARAM if candidate.bnb is None or candidate.bnb.nested else NF4_PLAIN_BYTES_PER_PARAM


def compute_bytes(candidate: Candidate, shape: ModelShape, device: str) -> int:
    """Bytes per activation element: bf16 autocast on CUDA (TRL's ``bf16=True``); the weights' dtype on the CPU."""
    return CUDA_COMPUTE_BYTES if device == "cuda" else weight_bytes(candidate, shape)


@dataclass(frozen=True)
class StateBytes:
    """The parameters' bytes: weights (quantized linears, adapters, the dequantization transient), the autocast copy
    of fp32 trainable weights, gradients, optimizer states, the optimizer step's and the tied embedding's
    temporaries, and a reference model. ``trainable_bytes``: bytes per trainable element."""

    weights: float
    autocast_copy: float
    gradients: float
    optimizer: float
    step_temporaries: float
    embedding_temporaries: float
    reference: float
    trainable_bytes: int
    step_gradients: float = 0.0  # gradient copies that exist only in the step (ZeRO's fp32 partition)


def state_bytes(candidate: Candidate, shape: ModelShape, device: str) -> StateBytes:
    counts = param_counts(shape, candidate.algo)
    w_bytes = weight_bytes(candidate, shape)
    act_bytes = compute_bytes(candidate, shape, device)
    lora, quant = candidate.lora, candidate.quantization

    # -- weights (2.1, 2.3) ------------------------------------------------------------------------------------
    if quant == "4bit":
        weights = counts.linear * four_bit_bytes(candidate) + (counts.total - counts.linear) * w_bytes
    elif quant == "8bit":
        weights = counts.linear * INT8_BYTES_PER_PARAM + (counts.total - counts.linear) * w_bytes
    else:
        weights = counts.total * w_bytes
    if quant is not None:
        weights += DEQUANT_TRANSIENT_LAYERS * census_for(shape, candidate.algo).largest_quantized * act_bytes
    tensors = trainable_tensors(shape, candidate)
    saved = saved_tensors(shape, candidate)
    if saved:
        tensors = tensors[:len(tensors) - len(saved)]
    trainable = sum(t.numel * t.count for t in tensors)
    # lora_modules_to_save's copies: in the weights' dtype (TRL casts a quantized model's trainable ones to bf16)
    s_bytes = QLORA_ADAPTER_BYTES if quant is not None else w_bytes
    s_count = sum(t.numel * t.count for t in saved)
    if lora is not None:
        t_bytes = QLORA_ADAPTER_BYTES if quant is not None else max(LORA_ADAPTER_BYTES, w_bytes)
        weights += trainable * t_bytes + s_count * s_bytes  # the adapters (and a reward model's score head) and
        #                                                     the modules trained whole, on top of the base
    else:
        t_bytes = w_bytes
    autocast_copy = 0.0
    if device == "cuda" and t_bytes == 4:  # fp32 trainable weights under bf16 autocast: a cached bf16 copy
        autocast_copy = AUTOCAST_WEIGHT_COPY_BYTES * (counts.linear if lora is None else trainable)
    if device == "cuda" and s_bytes == 4:
        autocast_copy += AUTOCAST_WEIGHT_COPY_BYTES * sum(t.numel * t.count for t in saved if not t.embedding)
    if lora is not None and lora.target_modules == "all-linear":
        # peft wraps fused experts (and routers): W + BA is materialized at each forward and kept for the backward
        autocast_copy += census_for(shape, candidate.algo).wrapped * max(act_bytes, w_bytes)

    # The end of the backward: with a trained, tied embedding, the LM head's gradient is already in ``.grad`` when
    # the embedding's backward returns its own (a new [V, h]) and the accumulation adds them (another) [V: measured
    # on the CPU meter, Qwen2.5-0.5B: +2 x V·h x 4 B over weights + gradients + AdamW].
    embedding_temporaries = 0.0
    if lora is None and shape.tied_embeddings and not candidate.unit.sequence_classifier:
        embedding_temporaries = TIED_EMBEDDING_GRAD_COPIES * counts.embedding * t_bytes

    # -- reference model (2.6): beta > 0 and no PEFT; reloaded from the path in the same dtype --------------------
    reference = counts.total * w_bytes if holds_reference(candidate) else 0.0
    return StateBytes(
        weights=weights, autocast_copy=autocast_copy, gradients=trainable * t_bytes + s_count * s_bytes,
        optimizer=optimizer_state_bytes(tensors, candidate.optim, t_bytes)
        + optimizer_state_bytes(saved, candidate.optim, s_bytes),
        step_temporaries=optimizer_step_temporary_bytes(tensors, candidate.optim, t_bytes)
        + optimizer_step_temporary_bytes(saved, candidate.optim, s_bytes),
        embedding_temporaries=embedding_temporaries, reference=reference, trainable_bytes=t_bytes,
    )


def synchronized_optimizer(optim: Optional[str]) -> bool:
    """bitsandbytes' optimizers (8-bit, paged and their 32-bit ones), which step one tensor at a time and synchronize
    the device after each [V code: bitsandbytes optim/optimizer.py ``Optimizer8bit.step``: ``sync_gpu(p)``, a
    ``torch.cuda.synchronize``, after every parameter's ``update_step``]."""
    name = optim or ""
    if name == "adamw_torch_8bit":
        return False
    return name in EIGHT_BIT_OPTIMS or name in BNB_32BIT_OPTIMS or "bnb" in name or name.startswith("paged_")
