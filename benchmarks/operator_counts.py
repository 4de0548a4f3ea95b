"""The operators one training step of a decoder dispatches, counted: the source of the throughput model's operator
constants (``autofit.memory_model._dispatch``, ``OPS_*``).

tiny-qwen2 is built from its configuration at 2 and at 4 layers (random weights), with TRL's fused LM head as SFT
runs it (entropy and top-1 accuracy computed), and a TorchDispatchMode counts every operator of its forward, its
backward (plain, and with non-reentrant checkpointing), LoRA r16 on every linear layer, and AdamW's step with
gradient clipping. The difference between 4 and 2 layers, halved, is the count per layer; what is left at 2 layers
is the rest of a pass (embeddings, rotary tables, the final norm, the head and the loss). On the CPU, where torch's
AdamW loops over the tensors one at a time.

    .venv/bin/python -m benchmarks.operator_counts        (seconds; prints a table, writes nothing)
"""

from __future__ import annotations

from typing import Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autofit.machine import resolve_model

MICRO_BATCH, LENGTH = 4, 128


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.operators = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.operators += 1
        return func(*args, **(kwargs or {}))


def _counted(run) -> int:
    with _Count() as count:
        run()
    return count.operators


def count(layers: int, *, lora: bool = False, checkpointing: bool = False) -> Dict[str, int]:
    """Operators of one micro-batch's forward and backward, and of one optimizer step, at ``layers`` layers."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    settings = dict(resolve_model("tiny-qwen2").config)
    config = AutoConfig.for_model(settings.pop("model_type"), **dict(settings, num_hidden_layers=layers))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.train()
    ids = torch.randint(0, config.vocab_size, (MICRO_BATCH, LENGTH))
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained)
    counts: Dict[str, int] = {}
    out: Dict[str, torch.Tensor] = {}

    def forward() -> None:
        out["loss"] = -model(input_ids=ids, labels=ids, fused_lm_head=True).log_probs.mean()

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(2):  # the second step: the optimizer's states exist
        counts["forward"] = _counted(forward)
        counts["backward"] = _counted(lambda: out["loss"].backward())
        counts["optimizer"] = _counted(step)
    counts["tensors"] = len(trained)
    return counts


def table() -> str:
    rows = []
    for label, kw in (("full", {}), ("checkpointing", {"checkpointing": True}), ("LoRA r16", {"lora": True})):
        two, four = count(2, **kw), count(4, **kw)
        per_layer = {key: (four[key] - two[key]) / 2 for key in ("forward", "backward")}
        rest = {key: two[key] - 2 * per_layer[key] for key in ("forward", "backward")}
        per_tensor = (four["optimizer"] - two["optimizer"]) / max(four["tensors"] - two["tensors"], 1)
        rows.append(f"| {label} | {per_layer['forward']:.0f} | {per_layer['backward']:.0f} | {rest['forward']:.0f} | "
                    f"{rest['backward']:.0f} | {per_tensor:.1f} |")
    return "\n".join(["| tiny-qwen2 | forward per layer | backward per layer | forward rest | backward rest | "
                      "optimizer per trained tensor |", "|---|---:|---:|---:|---:|---:|", *rows])


if __name__ == "__main__":
    print(table())
