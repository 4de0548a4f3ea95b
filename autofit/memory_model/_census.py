"""The model's parameters, tensor by tensor, and what peft and bitsandbytes do to them.

A ``Census`` is plain data: built from the model itself on the meta device (``_census_build``, in its own
process) or, where that cannot run, from the configuration's sizes (``_shape.analytic_census``: exact for the dense
llama/qwen2/gemma families, "unchecked" for the rest). The parameter terms of the ledger (weights, gradients,
optimizer states, LoRA adapters, what quantization replaces) are counted from it.

The rules it applies, read from the installed libraries:

- bitsandbytes (transformers' ``replace_with_bnb_linear``) replaces modules whose type is exactly ``nn.Linear``
  (or ``Conv1D``) outside ``get_keys_to_not_convert`` (the LM head, tied weights, the last module); fused 3-D
  expert tensors of transformers 5 mixture-of-experts models are not linear layers and stay in the load dtype.
- peft's ``all-linear`` (``_maybe_include_all_linear_layers``) adapts every ``nn.Linear``/``Conv1D`` but the output
  embedding (a reward model: but the score head, which ``modules_to_save`` trains whole); a list of names adapts
  the modules whose name is, or ends with ``.`` + , one of them. On transformers 5 mixture-of-experts models peft
  0.21 also turns ``all-linear`` into ``target_parameters`` on the fused experts and the router: what it builds is
  recorded at rank 1 by ``census_build`` (``lora_per_rank``, ``lora_wrapped``), since no rule here could say it.
- A reward model is the causal LM with the LM head replaced by ``score``, ``nn.Linear(hidden, 1, bias=False)``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from math import prod
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from autofit.core import algorithm
from autofit.machine import atomic_write_text, cache_subfolder, read_own_file
from autofit.memory_model._census_build import CENSUS_VERSION

log = logging.getLogger(__name__)

META = "meta"  # counted from the model built by transformers
ANALYTIC = "analytic"  # computed from the configuration's sizes
SCORE_HEAD = "score"
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class ParamGroup:
    """``count`` parameter tensors of one ``shape`` (the layers' copies of one weight). ``kind``: embedding,
    lm_head, experts (fused 3-D), matrix, vector or tensor (more dimensions: a vision tower's convolutions)."""

    name: str
    shape: Tuple[int, ...]
    kind: str
    count: int = 1

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class LinearGroup:
    """``count`` linear layers (``name`` with ``*`` for the layer index). ``quantizable``: bitsandbytes replaces it;
    ``output``: the output embedding (the LM head, or a reward model's score head)."""

    name: str
    d_in: int
    d_out: int
    bias: bool = False
    quantizable: bool = True
    output: bool = False
    count: int = 1

    @property
    def leaf(self) -> str:
        return self.name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Census:
    params: Tuple[ParamGroup, ...]
    linears: Tuple[LinearGroup, ...]
    tied: bool
    source: str = ANALYTIC
    attn_implementation: str = "sdpa"
    experts_implementation: str = ""
    # peft's "all-linear" LoRA as built on the model at rank 1 ((name, numel, count)); the parameters it wraps (fused
    # experts, routers: their W + BA is materialized at every forward). Empty where not built with peft.
    lora_per_rank: Tuple[Tuple[str, int, int], ...] = ()
    lora_wrapped: Tuple[str, ...] = ()

    # -- the numbers the ledger needs -----------------------------------------------------------------------------
    @property
    def total(self) -> int:
        return sum(p.numel * p.count for p in self.params)

    @property
    def experts(self) -> int:
        """Parameters in fused expert tensors."""
        return sum(p.numel * p.count for p in self.params if p.kind == "experts")

    @property
    def quantized(self) -> int:
        """Parameters bitsandbytes replaces with 4/8-bit weights."""
        return sum(g.d_in * g.d_out * g.count for g in self.linears if g.quantizable)

    @property
    def largest_quantized(self) -> int:
        return max((g.d_in * g.d_out for g in self.linears if g.quantizable), default=0)

    @property
    def wrapped(self) -> int:
        """Parameters peft's all-linear LoRA adapts through a materialized W + BA (fused experts, routers)."""
        return sum(p.numel * p.count for p in self.params if p.name in self.lora_wrapped)

    @property
    def embedding(self) -> int:
        return sum(p.numel for p in self.params if p.kind == "embedding")

    @property
    def head(self) -> int:
        """The output layer's weight, untied: the LM head (0 when tied) or the score head."""
        return sum(p.numel * p.count for p in self.params if p.kind in ("lm_head", SCORE_HEAD))

    def lora_modules(self, targets: Any = ALL_LINEAR) -> List[LinearGroup]:
        """The linear layers peft adapts for ``target_modules=targets``."""
        if targets is None or (isinstance(targets, str) and targets.lower() == ALL_LINEAR):
            return [g for g in self.linears if not g.output]
        names = [targets] if isinstance(targets, str) else list(targets)
        chosen = [g for g in self.linears if any(g.name == n or g.name.endswith("." + n) for n in names)]
        if not chosen:
            known = sorted({g.leaf for g in self.linears if not g.output})
            raise ValueError(f"LoRA targets {names} match no linear layer of this model: accepted are "
                             f"'{ALL_LINEAR}' or names among {known}")
        return chosen

    def modules_to_save(self, names: Tuple[str, ...] = ()) -> List[ParamGroup]:
        """Trained whole next to the adapters (peft keeps the original frozen and trains a copy): a reward model's
        score head (peft SEQ_CLS) and the modules ModelConfig's ``lora_modules_to_save`` names (a module whose name
        is, or ends with ``.`` + , one of them, as peft matches). A tied LM head named is a copy of the embedding of
        its own (peft copies the module, and the copy is no longer tied)."""
        saved = [p for p in self.params if p.kind == SCORE_HEAD or (p.kind != SCORE_HEAD and _named(p.name, names))]
        if self.tied and "lm_head" in names:
            saved += [p for p in self.params if p.kind == "embedding"][:1]
        return saved

    def for_reward(self) -> Census:
        """The sequence-classification model: the LM head replaced by ``score`` (hidden x 1, no bias), which is the
        last module (bitsandbytes keeps it) and the one peft trains whole."""
        hidden = next((p.shape[1] for p in self.params if p.kind == "embedding"), 0)
        params = tuple(p for p in self.params if p.kind != "lm_head") + (ParamGroup(SCORE_HEAD + ".weight", (1, hidden),
                                                                                    SCORE_HEAD),)
        linears = tuple(g for g in self.linears if not g.output) + (
            LinearGroup(SCORE_HEAD, hidden, 1, quantizable=False, output=True),)
        return replace(self, params=params, linears=linears, tied=False)

    def for_algo(self, algo: str) -> Census:
        return self.for_reward() if algorithm(algo).sequence_classifier else self

    # -- storage ----------------------------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Census:
        params = tuple(ParamGroup(str(p["name"]), tuple(int(d) for d in p["shape"]), str(p["kind"]), int(p["count"]))
                       for p in data["params"])
        linears = tuple(LinearGroup(str(g["name"]), int(g["d_in"]), int(g["d_out"]), bool(g["bias"]),
                                    bool(g["quantizable"]), bool(g["output"]), int(g["count"]))
                        for g in data["linears"])
        per_rank = tuple((str(a["name"]), int(a["numel"]), int(a["count"])) if isinstance(a, Mapping)
                         else (str(a[0]), int(a[1]), int(a[2])) for a in data.get("lora_per_rank") or ())
        return cls(params, linears, tied=bool(data["tied"]), source=str(data.get("source", META)),
                   attn_implementation=str(data.get("attn_implementation") or "sdpa"),
                   experts_implementation=str(data.get("experts_implementation") or ""),
                   lora_per_rank=per_rank, lora_wrapped=tuple(str(n) for n in data.get("lora_wrapped") or ()))


def _named(param: str, names: Tuple[str, ...]) -> bool:
    """Whether the parameter belongs to a module of ``names`` (peft's rule for ``modules_to_save``)."""
    module = param.rsplit(".", 1)[0]
    return any(module == n or module.endswith("." + n) for n in names)


def lora_tensors(census: Census, r: int, targets: Any = ALL_LINEAR, saved: Tuple[str, ...] = ()
                 ) -> List[Tuple[int, int]]:
    """(numel, count) of every trainable tensor of a LoRA model: A (r x d_in) and B (d_out x r) per adapted layer,
    and the modules trained whole (a reward model's score head, ``saved``: ModelConfig's lora_modules_to_save)."""
    tensors: List[Tuple[int, int]] = []
    all_linear = targets is None or (isinstance(targets, str) and targets.lower() == ALL_LINEAR)
    if all_linear and census.lora_per_rank:  # as peft built it (mixture-of-experts conversions included)
        tensors += [(r * numel, count) for _, numel, count in census.lora_per_rank]
    else:
        for g in census.lora_modules(targets):
            tensors += [(r * g.d_in, g.count), (r * g.d_out, g.count)]
    tensors += [(p.numel, p.count) for p in census.modules_to_save(saved)]
    return tensors


def lora_inputs_per_layer(census: Census, layers: int, targets: Any = ALL_LINEAR) -> float:
    """Input width summed over the adapted layers, per decoder layer (what LoRA dropout copies per token)."""
    return sum(g.d_in * g.count for g in census.lora_modules(targets) if not g.output) / max(layers, 1)


def _transformers_version() -> str:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "none"


def census_key(config: Mapping[str, Any]) -> str:
    """What a census is counted from (the configuration, transformers, the census's format): stored in its file and
    checked on every read, so a file that another configuration's census or another writer left there is not used."""
    key = json.dumps({"config": config, "transformers": _transformers_version(), "census": CENSUS_VERSION},
                     sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()


def census_file(config: Mapping[str, Any]) -> Path:
    """The census's file in the cache's ``census`` folder, created for this user only and checked as every level of
    the cache is (owner, mode)."""
    return cache_subfolder("census") / f"{census_key(config)[:16]}.json"


def store_census(config: Mapping[str, Any], data: Mapping[str, Any]) -> Path:
    """Write ``data`` (a census as ``_census_build`` counts it) as ``config``'s, with its key."""
    path = census_file(config)
    atomic_write_text(path, json.dumps({**data, "key": census_key(config)}))
    return path


def cached_census(config: Mapping[str, Any]) -> Optional[Census]:
    """The stored census of this configuration, or None (never built, or unreadable: it is built again)."""
    path = census_file(config)
    try:
        data = json.loads(read_own_file(path))  # a regular file of this user's, not a link, that no one else writes
        if not isinstance(data, dict) or data.get("key") != census_key(config):
            raise ValueError("it was not counted from this configuration")
        return Census.from_dict({**data, "source": META})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the parameter census %s (%s): it is counted again", path, exc)
        return None
