"""The host's dispatch against the device (issue 60, items 1 and 2): on a GPU kernels are queued ahead of the device,
so the launches only add where the device would wait for them; on the CPU meter the same thread does both. And peft's
adapters as inductor compiles them. Orderings from first principles on named cards; figures are benchmarks."""

import dataclasses

import pytest

from autofit.core import CARDS, Candidate, LoraSettings
from autofit.machine import resolve_model
from autofit.memory_model import measured_rates_card
from autofit.memory_model._dispatch import (
    OPS_QUANT4_FORWARD_PER_LAYER,
    Segments,
    exposed_dispatch,
    pass_operators,
    quantized_base_operators,
    zero3_hook_operators,
)
from autofit.memory_model._parameters import trainable_tensors
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._throughput import predict_speed

BIG = ModelShape.from_config(resolve_model("Qwen/Qwen2.5-7B").config)
SMALL = ModelShape.from_model("tiny-qwen2")
H100 = CARDS["H100"]


def _candidate(model, micro_batch, length, **kw):
    return Candidate(algo="sft", model=model, device="cuda", micro_batch=micro_batch, grad_accum=2, max_length=length,
                     dtype="bfloat16", **kw)


def _dispatched(candidate, shape, card):
    operators = pass_operators(candidate, shape, trainable_tensors(shape, candidate), card)
    return candidate.grad_accum * sum(operators) * card.op_seconds


def test_a_large_step_hides_its_launches_behind_the_device():
    candidate = _candidate("Qwen/Qwen2.5-7B", 8, 2048)
    estimate = predict_speed(candidate, BIG, H100)
    assert _dispatched(candidate, BIG, H100) > 0.02  # the host has work: it is queued ahead, not added
    assert estimate.terms["launch"] == 0.0


def test_a_small_step_waits_for_its_launches_and_no_more_than_them():
    candidate = _candidate("tiny-qwen2", 1, 64)
    estimate = predict_speed(candidate, SMALL, H100)
    dispatched = _dispatched(candidate, SMALL, H100)
    assert 0 < estimate.terms["launch"] < dispatched  # launch-bound, the device's own time overlapped
    device = sum(v for k, v in estimate.terms.items() if k in ("forward", "backward", "attention", "elementwise",
                                                                 "LM head tiles"))
    assert estimate.terms["launch"] + device == pytest.approx(dispatched, rel=0.05)  # the host's time, not the sum


def test_on_the_cpu_meter_every_operator_adds():
    cpu = measured_rates_card(190e9, 50e9)
    candidate = _candidate("tiny-qwen2", 4, 128).replace(device="cpu")
    assert predict_speed(candidate, SMALL, cpu).terms["launch"] == pytest.approx(_dispatched(candidate, SMALL, cpu))


def test_each_segment_between_synchronizations_overlaps_on_its_own():
    # a busy forward does not hide a backward's launches: the loss's synchronization drains the queue between them
    assert exposed_dispatch(Segments(1000, 1000), H100, Segments(1.0, 0.0)) == pytest.approx(1000 * H100.op_seconds)
    assert exposed_dispatch(Segments(1000, 1000), H100, Segments(1.0, 1.0)) == 0.0


def test_lora_on_a_small_model_waits_for_its_adapters_launches():
    candidate = _candidate("tiny-qwen2", 1, 64)
    lora = candidate.replace(lora=LoraSettings())
    assert predict_speed(lora, SMALL, H100).terms["launch"] > predict_speed(candidate, SMALL, H100).terms["launch"]


def test_compiled_adapters_move_fewer_bytes_than_eager_ones():
    candidate = _candidate("Qwen/Qwen2.5-7B", 2, 4096, lora=LoraSettings(target_modules="all-linear"))
    compiled = candidate.replace(user_args=(("torch_compile", True),))
    eager_lora, compiled_lora = predict_speed(candidate, BIG, H100), predict_speed(compiled, BIG, H100)
    eager_full = predict_speed(candidate.replace(lora=None), BIG, H100)
    compiled_full = predict_speed(compiled.replace(lora=None), BIG, H100)
    # what LoRA adds to the elementwise work is fused by inductor as the layer's own is
    assert compiled_lora.terms["elementwise"] - compiled_full.terms["elementwise"] < 0.5 * (
        eager_lora.terms["elementwise"] - eager_full.terms["elementwise"])
    # compiled, a LoRA step skips the weight gradients and the optimizer and pays less than that for its adapters
    assert compiled_lora.seconds_per_step < compiled_full.seconds_per_step


def _sharded(model, length, sharding, **kw):
    return _candidate(model, 1, length, sharding=sharding, ranks=2, checkpointing=True, **kw)


def test_zero3_hooks_every_module_on_the_host_where_fsdp2_hooks_none_of_them():
    mid = ModelShape.from_config(resolve_model("Qwen/Qwen2.5-7B").config)
    zero3, fsdp2 = _sharded("Qwen/Qwen2.5-7B", 256, "zero3"), _sharded("Qwen/Qwen2.5-7B", 256, "fsdp2")
    hooks = zero3_hook_operators(zero3, mid, trainable_tensors(mid, zero3))
    assert hooks.forward > 0 and hooks.backward > hooks.forward  # the backward's and the recompute's
    assert zero3_hook_operators(fsdp2, mid, trainable_tensors(mid, fsdp2)) == Segments(0.0, 0.0)
    plain = dataclasses.replace(zero3, checkpointing=False)
    assert zero3_hook_operators(plain, mid, []).backward < hooks.backward  # no recompute, no second forward's
    lora = dataclasses.replace(zero3, lora=LoraSettings(r=16))
    assert zero3_hook_operators(lora, mid, trainable_tensors(mid, lora)).forward > hooks.forward  # peft's modules


def test_zero3s_hooks_slow_short_rows_and_hide_behind_long_ones():
    card, engines = CARDS["A100-80GB"], ("zero3", "fsdp2")
    short = {engine: predict_speed(_sharded("Qwen/Qwen2.5-7B", 128, engine), BIG, card) for engine in engines}
    assert short["zero3"].terms["launch"] > short["fsdp2"].terms["launch"]
    assert short["zero3"].seconds_per_step > short["fsdp2"].seconds_per_step
    long = {engine: predict_speed(_sharded("Qwen/Qwen2.5-7B", 8192, engine), BIG, card) for engine in engines}
    assert long["zero3"].terms["launch"] == long["fsdp2"].terms["launch"] == 0.0  # the device keeps busy longer


def test_the_4bit_base_dispatches_on_every_layer_it_quantizes_and_an_8bit_one_is_not_charged():
    lora = _candidate("tiny-qwen2", 1, 64, lora=LoraSettings(r=16), checkpointing=True)
    qlora = dataclasses.replace(lora, quantization="4bit")
    trained = trainable_tensors(SMALL, lora)
    added = pass_operators(qlora, SMALL, trained, H100).forward - pass_operators(lora, SMALL, trained, H100).forward
    assert added == quantized_base_operators(qlora, SMALL).forward > 0
    assert quantized_base_operators(qlora, SMALL).forward == 7 * SMALL.layers * OPS_QUANT4_FORWARD_PER_LAYER
    recomputed = quantized_base_operators(qlora, SMALL).backward
    assert quantized_base_operators(dataclasses.replace(qlora, checkpointing=False), SMALL).backward < recomputed
    assert quantized_base_operators(dataclasses.replace(qlora, quantization="8bit"), SMALL) == Segments(0.0, 0.0)


def test_qlora_on_short_rows_is_slower_than_lora_and_the_same_on_long_ones():
    card = CARDS["A100-80GB"]
    for length, slower in ((128, True), (8192, False)):
        lora = _candidate("Qwen/Qwen2.5-7B", 1, length, lora=LoraSettings(r=16), checkpointing=True)
        qlora = dataclasses.replace(lora, quantization="4bit")
        launch = {c.quantization: predict_speed(c, BIG, card).terms["launch"] for c in (lora, qlora)}
        assert (launch["4bit"] > launch[None]) is slower
