"""Count a model's parameters from the model itself: the architecture built on the meta device (no memory, no
weights), every parameter tensor and every linear layer listed with what peft and bitsandbytes need to know.

Runs in its own process (``python -m autofit.memory_model._census_build CONFIG OUT``, see ``_census_cache``): it
imports torch and transformers, which the search process never does, and hides the GPU so that nothing here can
touch CUDA.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

CENSUS_VERSION = 4
NO_CAUSAL_LM_EXIT = 3  # the architecture has no AutoModelForCausalLM class (a vision-language model, say)


class NoCausalLM(Exception):
    """AutoModelForCausalLM cannot build this configuration."""


_INDEX = re.compile(r"\.\d+(?=\.|$)")


def pattern(name: str) -> str:
    """``model.layers.3.mlp.down_proj`` -> ``model.layers.*.mlp.down_proj``: one entry per repeated tensor."""
    return _INDEX.sub(".*", name)


def _grouped(entries: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    groups: Dict[str, Dict[str, Any]] = {}
    for entry in entries:
        key = json.dumps({k: v for k, v in entry.items() if k != "count"}, sort_keys=True)
        if key in groups:
            groups[key]["count"] += 1
        else:
            groups[key] = {**entry, "count": 1}
    return list(groups.values())


def build(config_dir: str, trust_remote_code: bool = False) -> Dict[str, Any]:
    """The census of the causal LM in ``config_dir`` (a folder with config.json, and the model's code if it brings
    its own). A reward model's census is derived from it (the LM head replaced by a score head)."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D
    try:
        from transformers.quantizers.base import get_keys_to_not_convert
    except ImportError:  # transformers 4
        from transformers.integrations.bitsandbytes import (  # type: ignore[attr-defined,no-redef]
            get_keys_to_not_convert,
        )

    config = AutoConfig.from_pretrained(config_dir, trust_remote_code=trust_remote_code)
    try:  # what TRL loads: AutoModelForCausalLM (a multimodal wrapper such as gemma3 whole, vision tower included)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
        raise NoCausalLM(str(getattr(config, "model_type", "?"))) from None
    model.tie_weights()
    input_embedding = model.get_input_embeddings()
    output_embedding = model.get_output_embeddings()
    embedding_weight = id(input_embedding.weight) if input_embedding is not None else None
    output_weight = id(output_embedding.weight) if output_embedding is not None else None
    tied = output_weight is not None and output_weight == embedding_weight

    params: List[Dict[str, Any]] = []
    seen = set()
    for name, tensor in model.named_parameters(remove_duplicate=False):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if id(tensor) == embedding_weight:
            kind = "embedding"
        elif id(tensor) == output_weight:
            kind = "lm_head"
        elif tensor.dim() == 3 and "expert" in name:
            kind = "experts"  # fused expert tensors (transformers 5 MoE): neither nn.Linear nor quantized
        elif tensor.dim() > 2:
            kind = "tensor"  # convolutions, position tables of a vision tower
        elif tensor.dim() == 2:
            kind = "matrix"
        else:
            kind = "vector"
        params.append({"name": pattern(name), "shape": list(tensor.shape), "kind": kind})

    not_convert = sorted(get_keys_to_not_convert(model))
    output_name = next((n for n, m in model.named_modules() if m is output_embedding), None)
    linears: List[Dict[str, Any]] = []
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.Linear, Conv1D)):
            continue
        if isinstance(module, Conv1D):
            d_in, d_out = module.weight.shape
        else:
            d_in, d_out = module.in_features, module.out_features
        linears.append({
            "name": pattern(name), "d_in": int(d_in), "d_out": int(d_out), "bias": module.bias is not None,
            # bitsandbytes replaces exactly nn.Linear (and Conv1D), not subclasses, outside ``not_convert``
            "quantizable": (type(module) is torch.nn.Linear or isinstance(module, Conv1D))
            and not any(name == key or name.startswith(key + ".") for key in not_convert),
            "output": name == output_name,
        })
    adapters, targets = _lora_per_rank(model)  # last: peft wraps the model's modules in place
    wrapped = sorted({str(p["name"]) for p in params
                      if any(p["name"] in (t, t + ".weight") or p["name"].endswith(("." + t, "." + t + ".weight"))
                             for t in targets)})
    return {
        "version": CENSUS_VERSION,
        "transformers": transformers.__version__,
        "model_type": str(getattr(config, "model_type", "")),
        "architecture": type(model).__name__,
        "total": sum(int(torch.Size(p["shape"]).numel()) for p in params),
        "tied": tied,
        "params": _grouped(params),
        "linears": _grouped(linears),
        "attn_implementation": str(getattr(model.config, "_attn_implementation", None) or "sdpa"),
        "experts_implementation": str(getattr(model.config, "_experts_implementation", None) or ""),
        "lora_per_rank": adapters,
        "lora_wrapped": wrapped,
    }


def _lora_per_rank(model: Any) -> Tuple[List[Dict[str, Any]], List[str]]:
    """What peft's ``all-linear`` LoRA trains, at rank 1 (every adapter tensor is linear in the rank), and the names
    of the parameters it wraps rather than a module: peft converts "all-linear" on transformers 5 mixture-of-experts
    models to ``target_parameters`` (the fused experts and the router), whose adapted weight W + BA is materialized
    at every forward. ([], []) without peft."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        return [], []
    config = LoraConfig(r=1, lora_alpha=1, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    adapters = [{"name": pattern(name), "numel": int(p.numel())}
                for name, p in peft_model.named_parameters() if p.requires_grad]
    wrapped = getattr(peft_model.peft_config["default"], "target_parameters", None) or []
    return _grouped(adapters), sorted(str(name) for name in wrapped)


def main(argv: List[str]) -> int:
    config_dir, out = argv[0], Path(argv[1])
    trust = len(argv) > 2 and argv[2] == "--trust-remote-code"
    try:
        out.write_text(json.dumps(build(config_dir, trust_remote_code=trust)))
    except NoCausalLM as exc:
        print(f"no causal LM: {exc}", file=sys.stderr)
        return NO_CAUSAL_LM_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
