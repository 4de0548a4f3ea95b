"""The throughput model (autofit.memory_model._throughput): the orderings and ratios every configuration must show,
from first principles, on named cards. Its figures against measurements are benchmarks, not tests."""

import pytest

from autofit.core import Candidate, LoraSettings, resolve_model
from autofit.memory_model._cards import CARDS, card_named
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._throughput import calibrated_scale, predict_speed

SHAPE = ModelShape.from_config(resolve_model("Qwen/Qwen2.5-7B").config)
BASE = Candidate(algo="sft", model="Qwen/Qwen2.5-7B", device="cuda", micro_batch=8, grad_accum=1, max_length=2048,
                 dtype="bfloat16")


def speed(candidate, card="H100"):
    return predict_speed(candidate, SHAPE, CARDS[card])


def test_checkpointing_recomputes_one_forward():
    plain, ckpt = speed(BASE), speed(BASE.replace(checkpointing=True))
    assert ckpt.terms["recompute"] == pytest.approx(plain.terms["forward"])
    # a forward is a third of a full fine-tune's compute: about a third more time
    assert 1.25 < ckpt.seconds_per_step / plain.seconds_per_step < 1.40


def test_lora_skips_the_weight_gradients():
    full, lora = speed(BASE), speed(BASE.replace(lora=LoraSettings()))
    assert 1.3 < full.seconds_per_step / lora.seconds_per_step < 1.6
    assert lora.terms["optimizer"] < full.terms["optimizer"] / 50


def test_smaller_micro_batches_cost_their_launches_and_efficiency():
    one, four = speed(BASE), speed(BASE.replace(micro_batch=2, grad_accum=4))
    assert one.tokens_per_step == four.tokens_per_step
    assert four.seconds_per_step > one.seconds_per_step
    assert four.terms["launch"] == pytest.approx(4 * one.terms["launch"])


def test_offload_adds_the_host_step_and_cards_order_by_their_peaks():
    assert speed(BASE.replace(offload="zero2-offload")).seconds_per_step > 2 * speed(BASE).seconds_per_step
    assert speed(BASE, "H100").tokens_per_second > speed(BASE, "A100-80GB").tokens_per_second \
        > speed(BASE, "L4").tokens_per_second


def test_decode_is_bandwidth_bound():
    grpo = BASE.replace(algo="grpo", max_length=512, prompt_length=128, micro_batch=8, lora=LoraSettings())
    h100, h200 = speed(grpo, "H100"), speed(grpo, "H200")  # same FLOP rate, 43% more bandwidth
    assert h100.terms["generation"] / h200.terms["generation"] == pytest.approx(4.8 / 3.35, rel=0.1)
    assert h100.terms["generation"] > h100.terms["forward"] + h100.terms["backward"]


def test_card_names_and_calibration():
    assert card_named("a100-80gb") is CARDS["A100-80GB"] and card_named("24GiB") is None
    assert calibrated_scale([(1.0, 2.0), (2.0, 4.0)]) == pytest.approx(2.0)
    assert calibrated_scale([]) is None
    assert speed(BASE).scaled(2.0).seconds_per_step == pytest.approx(2 * speed(BASE).seconds_per_step)


def test_estimate_prints_each_levels_speed_on_a_named_card(capsys):
    from autofit.cli import main

    assert main(["estimate", "--model", "Qwen/Qwen2.5-7B", "--algo", "sft", "--gpu-memory", "H100"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("lvl"))
    assert header.split()[-1] == "tok/s"
    assert "speed on one H100 (NVIDIA H100 SXM5 datasheet" in out
    fastest = next(line for line in out.splitlines() if line.startswith("fastest predicted fit: level"))
    assert "tok/s" in fastest and "s per optimizer step" in fastest
    # a size names no card: no speed, and the line says how to get one
    assert main(["estimate", "--model", "Qwen/Qwen2.5-7B", "--algo", "sft", "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "tok/s" not in next(line for line in out.splitlines() if line.startswith("lvl"))
    assert "speed: name a card" in out


def test_a_tie_of_timings_goes_to_the_named_cards_prediction_and_a_clear_gap_to_the_timing(tmp_path):
    """Issue 37, item 3, on CUDA: the card --gpu-memory names (H100) predicts; a size names no card (timing kept)."""
    from types import SimpleNamespace

    from fakes import spec_of

    from autofit.core import Outcome, ProbeResult
    from autofit.search._result import Fit, Record
    from autofit.search._speed_tie import SpeedJudge

    def fit(candidate, tps):
        return Fit(0, candidate, ProbeResult(outcome=Outcome.OK, peak_bytes=1, tokens_per_second=tps))

    # predicted 59% apart: beyond the one-scale band (20%) of a model calibrated on one timed probe
    plain, ckpt = BASE, BASE.replace(micro_batch=1, grad_accum=8, checkpointing=True)
    assert speed(plain).tokens_per_second > 1.2 * speed(ckpt).tokens_per_second
    guide = SimpleNamespace(shape=SHAPE)
    for gpu_memory, tie_to_model in (("H100", True), ("80GB", False)):
        spec = spec_of(device="cuda", model="Qwen/Qwen2.5-7B", budget_bytes=80 * 2**30, gpu_memory=gpu_memory,
                       out_dir=tmp_path)
        notes: list = []
        timed = [Record(0, plain, "probe", fit(plain, 1000).result, False)]
        judge = SpeedJudge(spec, guide, notes, timed)  # type: ignore[arg-type]
        assert judge.faster(fit(plain, 1000), fit(ckpt, 1050)) is tie_to_model  # 5%: within the noise
        assert judge.faster(fit(plain, 1000), fit(ckpt, 1500)) is False  # 50%: the timing decides
        assert len(notes) == int(tie_to_model) and all("on H100 predicts" in n for n in notes)


def test_estimate_compares_cards(capsys):
    from autofit.cli import main

    assert main(["estimate", "--model", "Qwen/Qwen2.5-7B", "--algo", "grpo", "--gpu-memory", "H100,L4"]) == 0
    out = capsys.readouterr().out
    assert out.count("autofit estimate: grpo Qwen/Qwen2.5-7B") == 2  # each card's whole estimate, then the comparison
    table = out[out.index("cards compared"):].splitlines()
    rows = {line.split()[0]: line.split() for line in table[2:]}
    assert set(rows) == {"H100", "L4"}
    assert float(rows["H100"][-1].replace(",", "")) > float(rows["L4"][-1].replace(",", ""))
    # one card that is no card: refused as --gpu-memory alone would refuse it, naming it
    assert main(["estimate", "--model", "Qwen/Qwen2.5-7B", "--gpu-memory", "H100,L5"]) == 2
    assert "'L5' is not valid" in capsys.readouterr().err
