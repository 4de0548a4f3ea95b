"""Activation offloading (TRL's ``activation_offloading``): the rung's rules, the search's choice against
checkpointing (a fake OOM model), the meter's transient host storages, the ledger, the export, and real TRL probes
on the simulated device, where TRL's own offloading code runs with the CPU standing for the accelerator."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from autofit import memory_model as mm
from autofit.core import Candidate, LoraSettings, Outcome, ProbeSettings, SearchSpec
from autofit.export import write as export_write
from autofit.probe._meters import SimulatedMeter
from autofit.rungs import DEFAULT_LADDER, RUNGS, ActivationOffload, LadderState, climb, resolve_ladder
from autofit.search import Search
from autofit.search._host_memory import host_shortfalls

try:
    from fakes import FormulaRunner, MiB, formula_spec
except ImportError:  # tests/ became a package
    from tests.fakes import FormulaRunner, MiB, formula_spec

LADDER = ["micro-batch", "checkpointing", "activation-offload"]


def candidate(**changes) -> Candidate:
    fields = dict(algo="reward", model="tiny-qwen2", device="cuda", micro_batch=1, grad_accum=1, max_length=512)
    fields.update(changes)
    return Candidate(**fields)


def spec(out_dir, budget, **changes) -> SearchSpec:
    return formula_spec(out_dir, budget, **changes)


# -- the rung -------------------------------------------------------------------------------------------------------
def test_the_rung_applies_to_sft_and_reward_models_only():
    rung = ActivationOffload()
    for algo in ("sft", "reward"):
        state = rung.apply(LadderState(candidate(algo=algo)))
        assert state.candidate.activation_offload and state.rungs == ("activation-offload",)
        assert state.candidate.training_args()["activation_offloading"] is True
    for algo in ("grpo", "rloo", "ppo"):  # TRL's RL trainers have no such field
        assert rung.apply(LadderState(candidate(algo=algo))) is None
    assert rung.apply(rung.apply(LadderState(candidate()))) is None


def test_on_the_cpu_only_a_ladder_that_names_it_probes_it():
    on_cpu = LadderState(candidate(device="cpu"))
    default = next(r for r in DEFAULT_LADDER if r.name == "activation-offload")
    assert default.apply(on_cpu) is None  # host and device are the same RAM there: it frees nothing real
    assert RUNGS["activation-offload"].apply(on_cpu).candidate.activation_offload


def test_it_comes_after_checkpointing_and_stacks_on_it():
    levels = climb(LadderState(candidate(), vary_batch=True), resolve_ladder(LADDER))
    last = levels[-1].candidate
    assert last.checkpointing and last.activation_offload and levels[-1].cost == "speed"


def test_stored_studies_keep_their_keys():
    plain = candidate()
    assert "activation_offload" not in json.dumps(plain.key())
    assert plain.key() != candidate(activation_offload=True).key()
    assert Candidate.from_dict(candidate(activation_offload=True).to_dict()).activation_offload


# -- the search: it competes with checkpointing on throughput -------------------------------------------------------
def _search(tmp_path, **runner_changes):
    # weights, gradients, AdamW: 600 MiB; activations 1 MiB per token, a quarter with checkpointing, an eighth offloaded
    runner = FormulaRunner(900 * MiB, act_bytes_per_token=MiB, **runner_changes)
    report = Search(spec(tmp_path, 900 * MiB), runner, resolve_ladder(LADDER)).run()
    return runner, report


def test_without_checkpointing_when_offloading_alone_fits_and_is_faster(tmp_path):
    runner, report = _search(tmp_path)
    chosen = report.chosen.candidate
    assert chosen.activation_offload and not chosen.checkpointing and chosen.micro_batch == 4
    assert any(note.startswith("checkpointing dropped") for note in report.notes)
    # the answer is the fastest of the speed class's fits
    with_ckpt = [c for c in runner.candidates if c.checkpointing and runner.fits(c)]
    assert with_ckpt and all(runner.tokens_per_second(c) < runner.tokens_per_second(chosen) for c in with_ckpt)


def test_checkpointing_wins_when_offloading_is_slow(tmp_path):
    runner, report = _search(tmp_path, act_offload_speed=0.3)
    chosen = report.chosen.candidate
    assert chosen.checkpointing and not chosen.activation_offload and chosen.micro_batch == 2
    tried_alone = [c for c in runner.candidates if c.activation_offload and not c.checkpointing]
    assert tried_alone, "the level without checkpointing was probed"


def test_host_shortfall_leaves_the_rung_out():
    start = LadderState(candidate(micro_batch=8))
    shape = mm.ModelShape.from_model("tiny-qwen2")
    least = mm.host_bytes(candidate(activation_offload=True, checkpointing=True), shape, "cuda")  # micro-batch 1
    rungs = resolve_ladder(LADDER)
    assert host_shortfalls(start, rungs, shape, "cuda", available=int(least)) == []
    [(rung, note)] = host_shortfalls(start, rungs, shape, "cuda", available=int(least) - 1)
    assert rung == "activation-offload" and note.startswith("rung activation-offload left out: its offloaded activ")


# -- the meter ------------------------------------------------------------------------------------------------------
def test_transient_host_storages_leave_the_replayed_peak():
    meter = SimulatedMeter(budget_bytes=3 * MiB, host_aware=True)
    with meter:
        meter.set_phase("forward_backward")
        activation = torch.empty(MiB // 4)  # 1 MiB on the device
        host_copy = torch.empty(MiB // 4)  # 1 MiB of host memory
        meter.mark_host(host_copy)
        assert meter.is_host(host_copy) and not meter.is_host(activation)
        brought_back = host_copy.clone()  # the backward pass's device copy
        del activation, host_copy, brought_back
        big_host = torch.empty(MiB)  # 4 MiB on the host: over the budget, but not the device's
        meter.mark_host(big_host)
        del big_host
    assert meter.peaks()["forward_backward"] == 2 * MiB  # the activation and the brought-back copy, never the host
    assert meter.host_peak_bytes == 4 * MiB
    meter.check_budget()  # no error: the device never held more than 2 MiB
    assert meter.stats()["host_peak_bytes"] == 4 * MiB


# -- the ledger -----------------------------------------------------------------------------------------------------
def test_ledger_moves_saved_activations_to_the_host():
    shape = mm.ModelShape.from_model("Qwen/Qwen2.5-7B")
    base = candidate(algo="sft", model="Qwen/Qwen2.5-7B", max_length=8192, lora=LoraSettings())
    for ckpt in (False, True):
        plain, offloaded = base.replace(checkpointing=ckpt), base.replace(checkpointing=ckpt, activation_offload=True)
        assert mm.predict(offloaded).total < mm.predict(plain).total
        assert mm.host_bytes(plain, shape, "cuda") == 0 < mm.host_bytes(offloaded, shape, "cuda")
    # with checkpointing only the layer inputs go to the host: 28 layers x 3584 x 2 B per token, and a few h outside
    host = mm.host_bytes(base.replace(checkpointing=True, activation_offload=True), shape, "cuda")
    assert 8192 * 28 * 3584 * 2 <= host <= 8192 * 32 * 3584 * 2


# -- real TRL probes on the simulated device ------------------------------------------------------------------------
def _probe(tmp_path, factory, **changes):
    from autofit.probe._worker import run_probe

    probe = ProbeSettings(steps=2, output_dir=str(tmp_path / "probe"))
    return run_probe(factory, candidate(device="cpu", probe=probe, **changes), None)


@pytest.mark.slow
@pytest.mark.floor
def test_trl_offloads_on_the_simulated_device_as_the_ledger_says(tmp_path):
    from autofit.probe.algos import reward

    plain = _probe(tmp_path, reward.build_trainer)
    offloaded = _probe(tmp_path, reward.build_trainer, activation_offload=True)
    assert plain.outcome is Outcome.OK and offloaded.outcome is Outcome.OK, offloaded.error
    assert offloaded.peak_bytes < 0.85 * plain.peak_bytes
    shape = mm.ModelShape.from_model("tiny-qwen2")
    c = candidate(device="cpu", activation_offload=True)
    # the ledger predicts what TRL sets out to offload: its host copies and what it kept on the device for a reused
    # address (see the next test), which the allocator decides
    meant = offloaded.stats["activation_meant_bytes"]
    assert offloaded.stats["activation_host_bytes"] <= meant <= offloaded.stats["activation_host_bytes"] + \
        offloaded.stats["activation_kept_bytes"]
    assert meant == pytest.approx(mm.host_bytes(c, shape, "cpu"), rel=0.05)
    assert mm.predict(c).total == pytest.approx(offloaded.peak_bytes, rel=0.05)


def test_a_reused_address_that_trl_keeps_on_the_device_is_counted(monkeypatch):
    """TRL skips offloading a tensor whose address it offloaded from earlier in the pass. A view's base can be freed
    once TRL has copied the view, and the allocator hand its address to a new tensor: that one stays on the device.
    Here the allocator's reuse is stood in for by giving the new tensor the freed one's storage key."""
    from trl.models import activation_offloading
    from trl.trainer import sft_trainer

    from autofit.rungs.activation_offload._probe import instrumented

    key_of = activation_offloading._get_unique_tensor_key
    reused = {}  # the new tensor's own key -> the freed tensor's
    monkeypatch.setattr(activation_offloading, "_get_unique_tensor_key",
                        lambda tensor: reused.get(key_of(tensor), key_of(tensor)))
    meter = SimulatedMeter(budget_bytes=64 * MiB, host_aware=True)
    x = torch.randn(2, 1024, requires_grad=True)
    w = torch.randn(1023, requires_grad=True)  # saved by both products and alive: a true duplicate, offloaded once
    with meter, instrumented(meter, simulated=True) as count:
        context = sft_trainer.get_act_offloading_ctx_manager(torch.nn.Linear(4, 4), use_pin_memory=False,
                                                             warn_if_no_head=False)
        with context:
            first_base = x * 2  # saves nothing: only the view below holds its storage
            first = first_base[0, 1:]  # a view at an offset: TRL offloads a copy of it
            first_key = key_of(first)
            y = first * w
            del first_base, first  # the view's storage is free now
            second_base = x * 3
            second = second_base[0, 1:]
            reused[key_of(second)] = first_key  # the allocator gave the second the first's address
            y = y + second * w
            del second_base, second
        y.sum().backward()
    assert count.peak == 2 * 1023 * 4  # the first view's copy and w's
    assert count.kept.peak == 1023 * 4 and count.kept.live == 0  # the second view, on the device until backward
    assert count.meant.peak == 3 * 1023 * 4
    assert torch.allclose(x.grad[0, 1:], 5 * w) and not x.grad[1].any() and torch.allclose(w.grad, 5 * x[0, 1:])


def test_an_address_that_was_a_parameters_is_counted_when_no_parameter_holds_it():
    """TRL skips saved tensors at its parameters' addresses, taken when the trainer was made: one the model no longer
    holds (replaced, freed, its address a new tensor's) keeps that tensor on the device. Here the allocator's reuse
    is stood in for by adding the tensor's address to TRL's set."""
    from trl.trainer import sft_trainer

    from autofit.rungs.activation_offload._probe import instrumented

    meter = SimulatedMeter(budget_bytes=64 * MiB, host_aware=True)
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 1024, requires_grad=True)
    with meter, instrumented(meter, simulated=True) as count:
        context = sft_trainer.get_act_offloading_ctx_manager(model, use_pin_memory=False, warn_if_no_head=False)
        with context:
            y = (x * 2).exp()  # exp saves its result: offloaded
            z = x * 3
            context.param_storages.add(z.untyped_storage().data_ptr())  # a freed parameter's address, reused
            y = y + z.sin()  # sin saves its input: z, at the stale address
            y = y + model(x[:, :4]).sum()  # the live parameter is skipped, and not counted
        y.sum().backward()
    assert count.peak == count.kept.peak == 2 * 1024 * 4 and count.meant.peak == 2 * count.peak
    assert torch.allclose(x.grad[:, 4:], 2 * (x[:, 4:] * 2).exp() + 3 * (x[:, 4:] * 3).cos())


@pytest.mark.slow
def test_a_trainer_that_does_not_offload_is_named(tmp_path):
    from autofit.probe.algos import reward

    def ignores_the_candidate(candidate):
        return reward.build_trainer(candidate.replace(activation_offload=False))

    result = _probe(tmp_path, ignores_the_candidate, activation_offload=True)
    assert result.outcome is not Outcome.OK and "activation_offloading off" in result.error


def test_export_says_what_is_offloaded(tmp_path):
    class HostCounting(FormulaRunner):
        def _result(self, cand, steps):
            result = super()._result(cand, steps)
            if cand.activation_offload and result.outcome is Outcome.OK:
                result = dataclasses.replace(result, stats={"activation_host_bytes": 40 * MiB,
                                                            "activation_kept_bytes": 2 * MiB})
            return result

    runner = HostCounting(900 * MiB, act_bytes_per_token=MiB)
    report = Search(spec(tmp_path, 900 * MiB), runner, resolve_ladder(LADDER)).run()
    assert report.chosen.candidate.activation_offload
    export_write(report, tmp_path)
    text = (tmp_path / "best.yaml").read_text()
    assert "activation_offloading: true  # activation-offload" in text
    assert "# activation offloading: saved activations in host memory until the backward pass (at most 40.00 MiB " \
           "measured)" in text
    assert "# TRL kept up to 2.00 MiB of them on the GPU in the probe" in text
    best = json.loads((tmp_path / "best.json").read_text())
    host = best["host_memory"]
    assert host["activation_bytes"] == host["bytes"] == 40 * MiB and host["optimizer_bytes"] is None
    assert host["activation_kept_on_device_bytes"] == 2 * MiB
    assert host["predicted_bytes"] > 0
    assert any(t.startswith("activation offloading") for t in best["trades"])


def test_the_longest_length_keeps_both_when_that_is_longer(tmp_path):
    runner = FormulaRunner(900 * MiB, act_bytes_per_token=MiB)
    longest = spec(tmp_path, 900 * MiB, maximize="length", min_length=64, max_length=8192, effective_batch=1)
    report = Search(longest, runner, resolve_ladder(LADDER)).run()
    chosen = report.chosen.candidate
    assert chosen.checkpointing and chosen.activation_offload  # 32x smaller activations: the longest sequences
    alone = [c for c in runner.candidates if c.activation_offload and not c.checkpointing and runner.fits(c)]
    assert alone and max(c.max_length for c in alone) < chosen.max_length
