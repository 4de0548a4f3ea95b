"""The model's shape from its configuration dict: sizes, dtype, attention layout, norms, and the census those sizes
give where none was counted from the model (``analytic_census``). Pure Python."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from autofit.memory_model._census import ANALYTIC, Census, LinearGroup, ParamGroup, cached_census
from autofit.memory_model._stored_checks import check_figures

log = logging.getLogger(__name__)


# Bytes per element of a dtype name (the configuration's ``torch_dtype``/``dtype``, ``model_init_kwargs["dtype"]``).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "bf16": 2, "fp16": 2, "half": 2, "float32": 4, "fp32": 4, "float": 4}
DEFAULT_DTYPE_BYTES = 4  # no dtype in the config: transformers builds float32

REQUIRED_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
# Attention and MLP modules of a decoder layer (the names PEFT's "all-linear" resolves to on llama/qwen2/gemma3).
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Models whose config class ties the input and output embeddings by default (transformers 5 config classes).
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")
# q/k RMSNorms over head_dim (gemma3, qwen3) and the number of hidden-size norms per decoder layer.
QK_NORM_TYPES = ("gemma3", "gemma3_text", "qwen3", "qwen3_moe", "olmo2")
NORMS_PER_LAYER = {"gemma2": 4, "gemma3": 4, "gemma3_text": 4, "glm4": 4}
# Qwen2's q/k/v projections always have a bias (modeling_qwen2: bias=True); others follow ``attention_bias``.
QKV_BIAS_TYPES = ("qwen2",)
# Families whose decoder layers use torch's ``nn.LayerNorm`` (not an eager RMSNorm) and a non-gated MLP
# (c_fc -> act -> c_proj); the census's linear names say it too where the model was built.
LAYER_NORM_TYPES = ("starcoder2",)
UNGATED_MLP_TYPES = ("starcoder2",)
UNGATED_MLP_LINEARS = ("c_fc", "fc1", "fc_in", "dense_h_to_4h")
# One fused q/k/v projection (phi3's ``qkv_proj``): q, k and v are slices of one output tensor.
FUSED_QKV_TYPES = ("phi3",)
FUSED_QKV_LINEARS = ("qkv_proj", "query_key_value", "Wqkv", "W_pack", "c_attn")


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
    layer_norm: bool = False  # torch's LayerNorm (saves mean/rstd, not a normalized copy) instead of an RMSNorm
    gated_mlp: bool = True  # act(gate) * up; False: act(fc) (starcoder2)
    fused_qkv: bool = False  # one q/k/v projection, sliced (phi3)
    rope_concat: bool = False  # partial rotary: the rotated part is concatenated back (phi3, glm4)
    eager_attention: bool = False
    attention_softcap: bool = False  # gemma2: tanh-capped attention scores (transformers then picks eager)
    final_softcap: bool = False  # gemma2: tanh-capped logits
    nested: bool = False  # a multimodal wrapper: the sizes are its text model's, the census counts the whole model
    # Mixture-of-experts: routed experts, experts per token, one expert's intermediate size, the shared experts'
    # intermediate size (qwen2_moe, deepseek) and how many decoder layers route (the others are dense).
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    moe_layers: int = 0
    max_positions: Optional[int] = None  # max_position_embeddings (vLLM's default max_model_len)
    # The parameters counted from the model built by transformers (None: not built here; see ``census``).
    census: Optional[Census] = field(default=None, compare=False)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """The shape of a decoder-only model from its HF configuration dict (a nested ``text_config`` is used)."""
        census = cached_census(config)
        nested = isinstance(config.get("text_config"), Mapping)
        if nested:  # multimodal wrappers (gemma3): the language model
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
            layer_norm=model_type in LAYER_NORM_TYPES,
            gated_mlp=not (model_type in UNGATED_MLP_TYPES or _has_linear(census, nested, UNGATED_MLP_LINEARS)),
            fused_qkv=model_type in FUSED_QKV_TYPES or _has_linear(census, nested, FUSED_QKV_LINEARS),
            rope_concat=_rope_parameter(config, "partial_rotary_factor") is not None,
            eager_attention=attn == "eager" or (census is not None and census.attn_implementation == "eager"),
            nested=nested,
            attention_softcap=bool(config.get("attn_logit_softcapping")),
            final_softcap=bool(config.get("final_logit_softcapping")),
            census=census,
            max_positions=int(config["max_position_embeddings"]) if config.get("max_position_embeddings") else None,
            **_experts(config, int(config["num_hidden_layers"])),
        )

    @classmethod
    def from_model(cls, name: str) -> ModelShape:
        """The shape of a bundled model, a local folder or a cached hub config (see ``autofit.machine._registry``)."""
        from autofit.machine import resolve_model

        return cls.from_config(resolve_model(name).config)

    def with_attention(self, name: Optional[str]) -> ModelShape:
        """The shape as loaded with ModelConfig's ``attn_implementation`` (None: the configuration's own): eager
        materializes the attention scores; sdpa, flash and flex attention do not. Softcapped attention (gemma2) is
        eager whatever is asked (transformers picks it)."""
        if name is None:
            return self
        return replace(self, eager_attention=name == "eager" or self.attention_softcap)

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

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def parameters(self) -> Census:
        """The census counted from the model where it was built, else the one computed from the sizes."""
        return self.census if self.census is not None else analytic_census(self)

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["census"] = self.census.to_dict() if self.census is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelShape:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if values.get("census") is not None:
            values["census"] = Census.from_dict(values["census"])
        shape = cls(**values)
        check_figures("shape", shape, positive=("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate",
                                                "vocab", "dtype_bytes"))
        return shape


def analytic_census(shape: ModelShape) -> Census:
    """The census of a llama-style decoder (``ModelShape``) computed from its sizes: what transformers builds for
    llama, mistral, qwen2, qwen3, gemma and gemma3 (exact), and for mixtral-style experts (fused gate_up/down per
    layer, a router, a shared expert); for other families a first guess."""
    h, layers = shape.hidden, shape.layers
    params: List[ParamGroup] = [ParamGroup("model.embed_tokens.weight", (shape.vocab, h), "embedding")]
    linears: List[LinearGroup] = []
    biases = {"q_proj": shape.qkv_bias, "k_proj": shape.qkv_bias, "v_proj": shape.qkv_bias, "o_proj": shape.o_bias,
              "gate_proj": shape.mlp_bias, "up_proj": shape.mlp_bias, "down_proj": shape.mlp_bias}

    def linear(full: str, d_in: int, d_out: int, count: int, bias: bool = False) -> None:
        if count:
            params.append(ParamGroup(full + ".weight", (d_out, d_in), "matrix", count))
            if bias:
                params.append(ParamGroup(full + ".bias", (d_out,), "vector", count))
            linears.append(LinearGroup(full, d_in, d_out, bias, True, False, count))

    for name, (d_in, d_out) in shape.linear_shapes().items():
        attention = name in ("q_proj", "k_proj", "v_proj", "o_proj")
        count = layers if attention else shape.dense_layers
        linear(f"model.layers.*.{'self_attn' if attention else 'mlp'}.{name}", d_in, d_out, count, biases[name])
    if shape.moe_layers:
        n, e, inter = shape.moe_layers, shape.experts, shape.expert_intermediate
        params += [ParamGroup("model.layers.*.mlp.gate.weight", (e, h), "matrix", n),
                   ParamGroup("model.layers.*.mlp.experts.gate_up_proj", (e, 2 * inter, h), "experts", n),
                   ParamGroup("model.layers.*.mlp.experts.down_proj", (e, h, inter), "experts", n)]
        if shape.shared_intermediate:
            for name, d_in, d_out in (("gate_proj", h, shape.shared_intermediate),
                                      ("up_proj", h, shape.shared_intermediate),
                                      ("down_proj", shape.shared_intermediate, h)):
                linear(f"model.layers.*.mlp.shared_expert.{name}", d_in, d_out, n)
    params.append(ParamGroup("model.layers.*.norm.weight", (h,), "vector", layers * shape.norms_per_layer))
    if shape.qk_norm:
        params.append(ParamGroup("model.layers.*.self_attn.qk_norm.weight", (shape.head_dim,), "vector", 2 * layers))
    params.append(ParamGroup("model.norm.weight", (h,), "vector"))
    if not shape.tied_embeddings:
        params.append(ParamGroup("lm_head.weight", (shape.vocab, h), "lm_head"))
    linears.append(LinearGroup("lm_head", h, shape.vocab, quantizable=False, output=True))
    return Census(tuple(params), tuple(linears), tied=shape.tied_embeddings, source=ANALYTIC,
                  attn_implementation="eager" if shape.eager_attention else "sdpa")


def _has_linear(census: Optional[Census], nested: bool, leaves: Tuple[str, ...]) -> bool:
    """A linear layer of the counted model has this name. Not for a multimodal wrapper, whose census counts the
    vision tower too (SigLIP's ``fc1``, fused ``qkv``)."""
    return census is not None and not nested and any(g.leaf in leaves for g in census.linears)


def _rope_parameter(config: Mapping[str, Any], key: str) -> Any:
    """A RoPE parameter: in ``rope_parameters`` (transformers 5), ``rope_scaling`` or at the top level (4)."""
    for nested in ("rope_parameters", "rope_scaling"):
        value = config.get(nested)
        if isinstance(value, Mapping) and value.get(key) is not None:
            return value[key]
    return config.get(key)


def _first(config: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return int(value)
    return 0


def _experts(config: Mapping[str, Any], layers: int) -> Dict[str, int]:
    """The mixture-of-experts sizes of a configuration (mixtral, qwen2_moe, qwen3_moe, olmoe, granitemoe, deepseek
    style keys); all zero for a dense model."""
    experts = _first(config, "num_local_experts", "num_experts", "n_routed_experts")
    top_k = _first(config, "num_experts_per_tok", "moe_topk", "top_k")
    if experts <= 1 or not top_k:
        return {}
    intermediate = _first(config, "moe_intermediate_size", "intermediate_size")
    shared = _first(config, "shared_expert_intermediate_size") or \
        _first(config, "n_shared_experts", "num_shared_experts") * intermediate
    dense = set(config.get("mlp_only_layers") or [])
    step = _first(config, "decoder_sparse_step") or 1
    first_dense = _first(config, "first_k_dense_replace")
    moe_layers = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0 and i >= first_dense)
    return {"experts": experts, "experts_per_token": top_k, "expert_intermediate": intermediate,
            "shared_intermediate": shared, "moe_layers": moe_layers}


def shape_or_none(model: str) -> Optional[ModelShape]:
    """The model's shape, or None (logged) for an architecture the ledger does not describe."""
    try:
        return ModelShape.from_model(model)
    except (KeyError, ValueError, TypeError) as exc:
        log.info("no memory model for %s (%s): plain bisection", model, exc)
        return None
