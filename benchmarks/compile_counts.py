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

    .venv/bin/python -m benchmarks.compile_counts        (minutes: eight compilations; prints, writes nothing)
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from autofit.machine import resolve_model

MICRO_BATCH, LENGTHS = 4, (64, 128)
Counts = Tuple[float, float, float]  # elementwise bytes, generated kernels, extern kernels


def _install(records: List[Counts]) -> None:
    """Record each lowered graph's counts (inductor computes them where its metrics log is on)."""
    import torch._inductor.graph as graph
    from torch._inductor import scheduler

    torch._logging.set_logs(inductor_metrics=True)
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


def count(layers: int, intermediate: int, length: int) -> Tuple[Counts, Counts]:
    """Counts of one compiled micro-batch's forward and backward of tiny-qwen2's decoder."""
    from transformers import AutoConfig, AutoModelForCausalLM

    records: List[Counts] = []
    _install(records)
    settings = dict(resolve_model("tiny-qwen2").config)
    settings.update(num_hidden_layers=layers, intermediate_size=intermediate)
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.train()
    torch._dynamo.reset()
    body = torch.compile(model.model)  # the head and the loss are the rest of a pass either way
    ids = torch.randint(0, config.vocab_size, (MICRO_BATCH, length))
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
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
