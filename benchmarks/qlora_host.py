"""The host time bitsandbytes' 4-bit base adds to a LoRA micro-batch, per quantized linear layer, measured: the
source of the throughput model's ``_dispatch.OPS_QUANT4_*``.

A ``Linear4bit`` runs its matmul through ``MatMul4Bit``: the forward's ``bitsandbytes::gemm_4bit`` op, which past a
few rows dequantizes (the nested absmax first, then the 4-bit weight, each a Python kernel of bitsandbytes'
``torch.library`` ops calling its C library) and then calls ``F.linear``; the backward dequantizes the weight again
for the input's gradient; checkpointing's recompute runs the forward's again [V code: bitsandbytes 0.50
``autograd/_functions.py`` ``MatMul4Bit``, ``backends/cuda/ops.py`` ``_dequant_linear_fallback``,
``backends/default/ops.py`` ``_gemm_4bit_default_impl``, the CPU's, with the same structure]. That work is Python on the
host whatever the card, and a TorchDispatchMode sees bitsandbytes' ops as one operator each, not what runs inside
them, so it is timed here on the CPU with widths too small for the arithmetic to count: tiny-qwen2 at 8 layers with
LoRA r16 on every linear layer, its base in float32 and the same base loaded 4-bit (NF4, nested, float32 compute) by
transformers' ``BitsAndBytesConfig``; one adapted projection of each (peft's ``Linear`` and its 4-bit ``Linear4bit``)
over one micro-batch's hidden states, forward, and forward with the backward of its input, blocks of calls taken in
turn. The difference is divided by the seconds of one operator this host dispatches in the float layer's forward and
backward (counted with a TorchDispatchMode), so the figure is in operators' worth of dispatch; a recompute runs the
forward's again.

    .venv/bin/python -m benchmarks.qlora_host        (under a minute; prints a table, writes nothing)
"""

from __future__ import annotations

import tempfile
import time
from typing import Any, Callable, Dict

import torch

from benchmarks.operator_counts import _Count
from benchmarks.zero3_hooks import LAYERS, LENGTH, MICRO_BATCH, _model, print_added

CALLS, BLOCKS = 50, 40


def _lora(quantized: bool) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    model = _model(LAYERS, checkpointing=False)
    if quantized:
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            four_bit = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                          bnb_4bit_compute_dtype=torch.float32)
            model = AutoModelForCausalLM.from_pretrained(folder, device_map="cpu", quantization_config=four_bit)
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    return model


def _best_per_call(runs: Dict[str, Callable[[], object]]) -> Dict[str, float]:
    """Seconds a call of each: the fastest of ``BLOCKS`` blocks of ``CALLS`` calls, after a warm-up, the runs taken
    in turn so that a busy spell of the machine slows all of them (the fastest: a busy machine only slows a run)."""
    for run in runs.values():
        for _ in range(CALLS):
            run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(BLOCKS):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                run()
            best[name] = min(best[name], (time.perf_counter() - start) / CALLS)
    return best


def _first_adapted(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj")


def measure() -> Dict[str, Any]:
    """One adapted projection's seconds over the float base and over the 4-bit one, forward and forward with the
    backward of its input, and one operator's seconds (the float one's forward and backward)."""
    plain, quantized = (_first_adapted(_lora(q)) for q in (False, True))
    inputs = torch.randn(MICRO_BATCH, LENGTH, plain.in_features, requires_grad=True)

    def forward(layer: torch.nn.Module) -> torch.Tensor:
        return layer(inputs)

    def both(layer: torch.nn.Module) -> None:
        out = layer(inputs)
        out.backward(torch.ones_like(out))

    with _Count() as count:
        both(plain)
    best = _best_per_call({"plain forward": lambda: forward(plain), "4-bit forward": lambda: forward(quantized),
                          "plain both": lambda: both(plain), "4-bit both": lambda: both(quantized)})
    added_forward = best["4-bit forward"] - best["plain forward"]
    return {"op_seconds": best["plain both"] / count.operators, "layer": type(quantized).__module__,
            "forward": added_forward, "backward": best["4-bit both"] - best["plain both"] - added_forward}


def main() -> None:
    figures = measure()
    print_added(figures, f"one operator of the float layer's forward and backward: {figures['op_seconds'] * 1e6:.1f} "
                f"µs; the 4-bit layer is {figures['layer']}'s, {MICRO_BATCH} x {LENGTH} tokens",
                "the 4-bit base adds per quantized layer", ("forward", "backward"))


if __name__ == "__main__":
    main()
