"""The host time DeepSpeed ZeRO-3 adds to a micro-batch, per module, measured: the source of the throughput model's
``_dispatch.OPS_ZERO3_PER_MODULE``.

ZeRO-3 registers four hooks on every submodule of the model: a pre-forward hook that fetches its parameters (the
coordinator's trace and prefetch), a post-forward hook that releases them, and two autograd functions wrapped around
its inputs and outputs whose backwards fetch and release them again for the backward; checkpointing's recompute runs
the forward hooks once more [V code: DeepSpeed 0.19 ``runtime/zero/parameter_offload.py``,
``_register_deepspeed_module``]. They are Python on the host, whatever the card, so they are timed here on the CPU
with widths too small for the arithmetic to count: tiny-qwen2 at 2 and at 6 layers, one forward and backward of one
micro-batch (no optimizer step), plain PyTorch against the same model under a one-rank ZeRO-3 engine (gloo). The
difference between 6 and 2 layers isolates the decoder layers' modules; it is divided by those modules and by the
seconds of one operator this host dispatches in the plain run (counted with a TorchDispatchMode), so the figure is in
operators' worth of dispatch: a host that dispatches faster runs the hooks faster too.

    .venv/bin/python -m benchmarks.zero3_hooks        (about two minutes; prints a table, writes nothing)
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Mapping, Sequence

import torch

from autofit.machine import resolve_model
from benchmarks.operator_counts import _Count

MICRO_BATCH, LENGTH = 1, 16
LAYERS = 8
REPEATS = 20
WIDTHS = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 256, "bos_token_id": 253, "eos_token_id": 254, "pad_token_id": 255}  # too small to count


def _model(layers: int, checkpointing: bool) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = dict(resolve_model("tiny-qwen2").config)
    config = AutoConfig.for_model(settings.pop("model_type"), **dict(settings, **WIDTHS, num_hidden_layers=layers))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _best_of_each(runs: Dict[str, Callable[[], None]]) -> Dict[str, float]:
    """The fastest of ``REPEATS`` runs of each, after three warm-ups, the runs taken in turn so that a busy spell of
    the machine slows both (and the fastest, not the median: a busy machine only slows a run down)."""
    for run in runs.values():
        for _ in range(3):
            run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(REPEATS):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _ids(model: torch.nn.Module) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (MICRO_BATCH, LENGTH))


PASSES = {"forward": (False, False), "forward and backward": (True, False),
          "forward and backward, checkpointed": (True, True)}  # (backward, checkpointing)


def _compared(backward: bool, checkpointing: bool) -> Dict[str, float]:
    """Seconds of one micro-batch, plain and under a one-rank ZeRO-3 engine, and the plain run's operators and the
    model's modules."""
    import deepspeed

    plain, sharded = _model(LAYERS, checkpointing), _model(LAYERS, checkpointing)
    ids = _ids(plain)
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 10**6,
              "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True,
                                    "stage3_param_persistence_threshold": 0},
              "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=sharded, optimizer=torch.optim.AdamW(sharded.parameters()),
                                      config=config)

    def plain_step() -> None:
        loss = plain(input_ids=ids, labels=ids).loss
        if backward:
            loss.backward()

    def zero3_step() -> None:  # a micro-batch inside an accumulation: the engine never steps the optimizer
        loss = engine(input_ids=ids, labels=ids).loss
        if backward:
            engine.backward(loss)

    with _Count() as count:
        plain_step()
    seconds = _best_of_each({"plain": plain_step, "zero3": zero3_step})
    engine.destroy()
    return dict(seconds, operators=count.operators, modules=sum(1 for _ in plain.modules()))


def measure() -> Dict[str, float]:
    """Per module: ZeRO-3's added seconds in each pass, and one operator's seconds (the plain forward and
    backward's), the passes as the differences of the three runs."""
    import deepspeed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29517"), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    deepspeed.init_distributed(dist_backend="gloo")
    added, figures = {}, {}
    for name, (backward, checkpointing) in PASSES.items():
        run = _compared(backward, checkpointing)
        added[name] = (run["zero3"] - run["plain"]) / run["modules"]
        if name == "forward and backward":
            figures["op_seconds"] = run["plain"] / run["operators"]
            figures["modules"] = run["modules"]
    figures["forward"] = added["forward"]
    figures["backward"] = added["forward and backward"] - added["forward"]
    figures["recompute"] = added["forward and backward, checkpointed"] - added["forward and backward"]
    return figures


def print_added(figures: Mapping[str, Any], heading: str, added: str, passes: Sequence[str]) -> None:
    """A host-time benchmark's table: what each pass adds, in microseconds and in operators of ``op_seconds``."""
    print(heading)
    print(f"| pass | {added} (µs) | in operators |")
    print("|---|---:|---:|")
    for name in passes:
        print(f"| {name} | {figures[name] * 1e6:.0f} | {figures[name] / figures['op_seconds']:.1f} |")


def main() -> None:
    figures = measure()
    print_added(figures, f"one operator of the plain forward and backward: {figures['op_seconds'] * 1e6:.1f} µs; "
                f"{figures['modules']:.0f} modules at {LAYERS} layers", "ZeRO-3 adds per module",
                ("forward", "backward", "recompute"))


if __name__ == "__main__":
    main()
