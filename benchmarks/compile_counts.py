"""The bytes and kernels of a decoder layer as ``torch.compile`` runs it, counted by inductor: the source of the
throughput model's compiled constants (``autofit.memory_model._traffic.COMPILED``,
``autofit.memory_model._dispatch.KERNELS_COMPILED_*``; issue 60, item 4).

tiny-qwen2's decoder (bf16 weights, random) is compiled with inductor at 2 and 4 layers, two lengths and two MLP
widths; for every graph inductor lowers (the forward, then AOTAutograd's backward) its own byte count of each kernel
(``GraphLowering.count_bytes``, what ``inductor_metrics`` logs) is added up, the extern kernels (the matmuls, the
attention) left out as ``benchmarks.traffic_counts`` leaves them out of the eager counts, and the kernels are
counted, generated and extern. The differences give a layer's bytes per token, per unit of the hidden size and of the
MLP's, and its kernels, as ``traffic_counts`` does for eager. On the CPU's inductor: a GPU's Triton fusion may keep a
few more passes apart.

    .venv/bin/python -m benchmarks.compile_counts        (minutes: 18 compilations; prints, writes nothing)
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from autofit.machine import resolve_model

MICRO_BATCH, LENGTHS = 4, (64, 128)
Counts = Tuple[float, float, float]  # elementwise bytes, generated kernels, extern kernels


RECORDS: List[Counts] = []  # every lowered graph's counts, in order (``_install``)


def _install(records: List[Counts] = RECORDS) -> None:
    """Record each lowered graph's counts (inductor computes them where its metrics log is on), every graph lowered
    afresh: a cached graph is not lowered, so its counts would be missing."""
    import torch._inductor.config as inductor_config
    import torch._inductor.graph as graph
    from torch._inductor import scheduler

    torch._logging.set_logs(inductor_metrics=True)
    inductor_config.force_disable_caches = True
    original = graph.GraphLowering.count_bytes
    if getattr(original, "_counted", False):
        return

    def count_bytes(self):
        total, counts, runtimes = original(self)
        elementwise = kernels = extern = 0
        for node, elements in counts:
            if isinstance(node, scheduler.ExternKernelSchedulerNode):
                extern += 1
            else:
                elementwise += elements * 4  # count_bytes reports bytes // 4
                kernels += 1
        records.append((elementwise, kernels, extern))
        return total, counts, runtimes

    count_bytes._counted = True  # type: ignore[attr-defined]
    graph.GraphLowering.count_bytes = count_bytes  # type: ignore[method-assign]


def count(layers: int, intermediate: int, length: int, lora: Optional[str] = None, dropout: float = 0.0
          ) -> Tuple[Counts, Counts]:
    """Counts of one compiled micro-batch's forward and backward of tiny-qwen2's decoder (with peft's LoRA r16 on the
    ``lora`` module of every layer: its adapters in float32, peft's default)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    records = RECORDS
    _install(records)
    settings = dict(resolve_model("tiny-qwen2").config)
    settings.update(num_hidden_layers=layers, intermediate_size=intermediate)
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_dropout=dropout, target_modules=[lora],
                                                 task_type="CAUSAL_LM")).base_model.model
    model.train()
    torch._dynamo.reset()
    body = torch.compile(model.model)  # the head and the loss are the rest of a pass either way
    ids = torch.randint(0, config.vocab_size, (MICRO_BATCH, length))
    records.clear()
    out = body(input_ids=ids).last_hidden_state
    forward = tuple(sum(r[i] for r in records) for i in range(3))
    records.clear()
    out.float().pow(2).mean().backward()
    backward = tuple(sum(r[i] for r in records) for i in range(3))
    return forward, backward  # type: ignore[return-value]


def table() -> str:
    settings = resolve_model("tiny-qwen2").config
    hidden, small = settings["hidden_size"], settings["intermediate_size"]
    found: Dict[Tuple[int, int, int], Tuple[Counts, Counts]] = {
        (layers, width, length): count(layers, width, length)
        for layers in (2, 4) for width in (small, 2 * small) for length in LENGTHS}

    def layer(width: int, length: int, part: int, index: int) -> float:
        return (found[(4, width, length)][part][index] - found[(2, width, length)][part][index]) / 2

    tokens = MICRO_BATCH * (LENGTHS[1] - LENGTHS[0])
    rows = ["| compiled, bf16 | bytes per token per layer per hidden unit | per MLP intermediate unit | "
            "kernels per layer (generated + extern) |", "|---|---:|---:|---:|"]
    for part, name in ((0, "forward"), (1, "backward")):
        a, b = ((layer(width, LENGTHS[1], part, 0) - layer(width, LENGTHS[0], part, 0)) / tokens
                for width in (small, 2 * small))
        slope = (b - a) / small
        rows.append(f"| {name} | {(a - slope * small) / hidden:.1f} | {slope:.1f} | "
                    f"{layer(small, LENGTHS[1], part, 1):.0f} + {layer(small, LENGTHS[1], part, 2):.0f} |")
    return "\n".join(rows + [""] + lora_table(hidden, small))


def lora_table(hidden: int, small: int) -> List[str]:
    """peft's adapter per adapted module, per input and per output feature (LoRA on q_proj, hidden to hidden, against
    down_proj, intermediate to hidden; per layer, four layers less two), as ``benchmarks.traffic_counts`` splits the
    eager ones; the backward's count per output feature is the frozen base's saved bias gradient (negative)."""
    tokens, length = MICRO_BATCH * LENGTHS[1], LENGTHS[1]
    rows = ["| compiled, bf16 base, LoRA r16 | dropout | bytes per token per adapted module: forward, per input "
            "feature | per output feature | backward, per input feature | per output feature | kernels per module, "
            "forward (generated + extern) |", "|---|---:|---:|---:|---:|---:|---:|"]

    def layer(module: Optional[str], dropout: float) -> Tuple[Counts, Counts]:
        two, four = count(2, small, length, module, dropout), count(4, small, length, module, dropout)
        return tuple(tuple((b - a) / 2 for a, b in zip(two[part], four[part], strict=True))
                     for part in (0, 1))  # type: ignore[return-value]

    plain = layer(None, 0.0)
    for dropout in (0.0, 0.1):
        q, down = layer("q_proj", dropout), layer("down_proj", dropout)
        cells = []
        for part in (0, 1):
            per_in = (down[part][0] - q[part][0]) / tokens / (small - hidden)
            per_out = ((q[part][0] - plain[part][0]) / tokens - per_in * hidden) / hidden
            cells += [f"{per_in:.1f}", f"{per_out:.1f}"]
        kernels = f"{q[0][1] - plain[0][1]:.0f} + {q[0][2] - plain[0][2]:.0f}"
        rows.append(f"| LoRA r16 | {dropout} | " + " | ".join(cells) + f" | {kernels} |")
    return rows


if __name__ == "__main__":
    print(table())
