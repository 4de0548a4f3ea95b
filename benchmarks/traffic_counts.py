"""The bytes a decoder layer's elementwise work moves per token, counted: the source of the throughput model's traffic
constants (``autofit.memory_model._throughput``, ``TRAFFIC_*``).

Everything a training step does besides its matmuls and its attention kernel reads and writes whole activations: the
norms (transformers' RMSNorm upcasts to fp32 and back), the rotary embedding, the gated MLP's activation and
product, the residual adds, casts, and in the backward each of their gradients; LoRA adds its dropout, scale and add
per adapted module. Those passes are bound by memory bandwidth, not FLOPs. A TorchDispatchMode adds up the bytes of
every tensor each operator reads and writes (views, matmuls, the attention kernel and the embedding excluded) over a
forward and a backward of tiny-qwen2's architecture (random weights) at 2 and 4 layers: the difference, halved, is a
layer's. Two intermediate sizes separate what scales with the hidden size from what scales with the MLP's; two LoRA
targets, an adapter's input from its output. Weights in bf16 ("pure bf16") and in fp32 under bf16 autocast (TRL's
default on CUDA: it loads fp32 weights) move different bytes, so both are counted.

    .venv/bin/python -m benchmarks.traffic_counts        (about a minute; prints a table, writes nothing)
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from autofit.machine import resolve_model

MICRO_BATCH, LENGTHS = 4, (64, 128)
EXCLUDED = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product", "embedding", "_efficient_attention",
            "_flash_attention", "detach", "empty", "lift_fresh")


class _Traffic(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not func.is_view and not any(name.startswith(prefix) for prefix in EXCLUDED):
            tensors = [t for t in tree_flatten((args, kwargs or {}, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


EXPERTS, EXPERTS_PER_TOKEN = 8, 2  # Mixtral's
MODES = {"bf16": (torch.bfloat16, False), "fp32": (torch.float32, False), "fp32 + bf16 autocast": (torch.float32, True)}


def count(layers: int, intermediate: int, length: int, *, mode: str, checkpointing: bool = False,
          lora: Optional[Tuple[str, ...]] = None, dropout: float = 0.1, experts: int = 0) -> Dict[str, int]:
    """Bytes of one micro-batch's forward and backward at ``layers`` layers and ``length`` tokens a row; with
    ``experts``, tiny-qwen2's sizes as a Mixtral whose MLP is that many experts, two per token."""
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = dict(resolve_model("tiny-qwen2").config)
    settings.update(num_hidden_layers=layers, intermediate_size=intermediate)
    if experts:
        settings.update(model_type="mixtral", num_local_experts=experts, num_experts_per_tok=EXPERTS_PER_TOKEN)
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(0)
    dtype, autocast_bf16 = MODES[mode]
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_dropout=dropout, target_modules=list(lora),
                                                 task_type="CAUSAL_LM"))
    model.train()
    ids = torch.randint(0, config.vocab_size, (MICRO_BATCH, length))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast_bf16 else contextlib.nullcontext()
    with _Traffic() as forward:  # the head and the loss are the rest of a pass: the layer difference removes them
        with autocast:
            loss = model(input_ids=ids).logits.float().mean()
    with _Traffic() as backward:
        loss.backward()
    return {"forward": forward.bytes, "backward": backward.bytes}


def per_layer(intermediate: int, **kw) -> Dict[str, float]:
    """A layer's bytes per token: the difference of 4 and 2 layers, halved, and of two lengths over their tokens
    (what is left is what a pass moves whatever its tokens: the weights' casts and gradients)."""
    short, long = ({key: (four[key] - two[key]) / 2 for key in four} for two, four in (
        (count(2, intermediate, length, **kw), count(4, intermediate, length, **kw)) for length in LENGTHS))
    tokens = MICRO_BATCH * (LENGTHS[1] - LENGTHS[0])
    return {key: (long[key] - short[key]) / tokens for key in ("forward", "backward")}


def table() -> str:
    settings = resolve_model("tiny-qwen2").config
    hidden, small = settings["hidden_size"], settings["intermediate_size"]
    large = 2 * small
    rows = ["| weights | pass | bytes per token per layer per hidden unit | per MLP intermediate unit | "
            "checkpointing's recompute, per hidden / intermediate unit |", "|---|---|---:|---:|---:|"]
    lora_rows = ["| weights | LoRA r16 dropout | bytes per token per adapted module: forward, per input feature | "
                 "per output feature | backward, per input feature | per output feature |",
                 "|---|---|---:|---:|---:|---:|"]
    slopes: Dict[str, Dict[str, float]] = {}
    for label in MODES:
        a, b = per_layer(small, mode=label), per_layer(large, mode=label)
        ckpt_a, ckpt_b = (per_layer(size, mode=label, checkpointing=True) for size in (small, large))
        for key in ("forward", "backward"):
            slope = slopes.setdefault(label, {})[key] = (b[key] - a[key]) / (large - small)
            base = (a[key] - slope * small) / hidden
            extra = ""
            if key == "backward":
                recompute_slope = (ckpt_b[key] - ckpt_a[key]) / (large - small) - slope
                recompute_base = (ckpt_a[key] - a[key] - recompute_slope * small) / hidden
                extra = f"{recompute_base:.1f} / {recompute_slope:.1f}"
            rows.append(f"| {label} | {key} | {base:.1f} | {slope:.1f} | {extra} |")
        plain = per_layer(small, mode=label)
        for dropout in (0.1, 0.0):
            q = per_layer(small, mode=label, lora=("q_proj",), dropout=dropout)  # in = out = hidden
            down = per_layer(small, mode=label, lora=("down_proj",), dropout=dropout)  # in = intermediate, out = hidden
            cells = []
            for key in ("forward", "backward"):
                per_in = (down[key] - plain[key] - (q[key] - plain[key])) / (small - hidden)
                per_out = (q[key] - plain[key] - per_in * hidden) / hidden
                cells += [f"{per_in:.1f}", f"{per_out:.1f}"]
            lora_rows.append(f"| {label} | {dropout} | " + " | ".join(cells) + " |")
    dense, moe = per_layer(small, mode="bf16"), per_layer(small, mode="bf16", experts=EXPERTS)
    extra_experts = (EXPERTS_PER_TOKEN - 1) * small  # the second expert's MLP, counted as the dense one's
    routing = [f"{(moe[key] - dense[key] - slopes['bf16'][key] * extra_experts) / (hidden * EXPERTS_PER_TOKEN):.1f}"
               for key in ("forward", "backward")]
    moe_rows = ["| weights | a mixture-of-experts layer's routing (gathering each token to its experts, weighting and "
                "adding back), bytes per token per hidden unit per expert it runs: forward | backward |",
                "|---|---:|---:|", f"| bf16 | {routing[0]} | {routing[1]} |"]
    return "\n".join(rows + [""] + lora_rows + [""] + moe_rows)


if __name__ == "__main__":
    print(table())
