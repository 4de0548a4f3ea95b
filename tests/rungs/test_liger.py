"""Liger's kernels (``use_liger_kernel``): the rung's rules, where it is left out and why, the search with a fake OOM
model (a free rung; a machine where the kernels break goes on without them), the ledger, the export, and real TRL
probes on the simulated device with a stand-in package that keeps Liger's saved-tensor contract in plain torch
(``tests/liger_stand_in``: Liger's Triton kernels need a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from autofit import memory_model as mm
from autofit.core import Candidate, LoraSettings, Outcome, ProbeResult, ProbeSettings
from autofit.export import write as export_write
from autofit.rungs import DEFAULT_LADDER, RUNGS, LadderState, LigerKernels, resolve_ladder, usable_rungs
from autofit.rungs.liger import KERNEL_FAILURE
from autofit.search import Search

try:
    from fakes import FormulaRunner, formula_spec
except ImportError:  # tests/ became a package
    from tests.fakes import FormulaRunner, formula_spec

STAND_IN = Path(__file__).resolve().parents[1] / "liger_stand_in"
LADDER = ["liger-kernels", "micro-batch", "checkpointing"]


def candidate(**changes) -> Candidate:
    fields = dict(algo="sft", model="tiny-qwen2", device="cuda", micro_batch=4, grad_accum=1, max_length=512)
    fields.update(changes)
    return Candidate(**fields)


@pytest.fixture
def liger_installed(monkeypatch):
    """The stand-in importable as ``liger_kernel``; gone again (modules and transformers' cached check) after."""
    from transformers.utils import import_utils

    # transformers 5 caches the check (lru_cache); 4.56, the floor, decided at its import whether the package exists
    forget = getattr(import_utils.is_liger_kernel_available, "cache_clear", lambda: None)
    monkeypatch.syspath_prepend(str(STAND_IN))
    if hasattr(import_utils, "_liger_kernel_available"):
        monkeypatch.setattr(import_utils, "_liger_kernel_available", True)
    forget()
    yield
    for name in [n for n in sys.modules if n.split(".")[0] == "liger_kernel"]:
        del sys.modules[name]
    forget()


# -- the rung -------------------------------------------------------------------------------------------------------
def test_the_rung_is_free_and_comes_right_after_the_allocator():
    names = [r.name for r in DEFAULT_LADDER]
    assert names.index("liger-kernels") == names.index("expandable-segments") + 1
    state = LigerKernels().apply(LadderState(candidate()))
    assert state.cost == "free" and state.rungs == ("liger-kernels",) and state.candidate.liger
    args = state.candidate.training_args()
    assert args["use_liger_kernel"] is True and args["liger_kernel_config"] == {"fused_linear_cross_entropy": False}
    assert "use_liger_kernel" not in candidate().training_args()


def test_it_applies_to_the_trainers_that_take_the_flag():
    rung = LigerKernels()
    for algo in ("sft", "reward", "grpo", "rloo"):
        assert rung.apply(LadderState(candidate(algo=algo))).candidate.liger
    assert rung.apply(LadderState(candidate(algo="ppo"))) is None  # trl 1.12's PPO loop: not patched
    assert rung.apply(rung.apply(LadderState(candidate()))) is None
    for decided in (True, False):  # the user's own use_liger_kernel, either way, is kept
        assert rung.apply(LadderState(candidate(user_args=(("use_liger_kernel", decided),)))) is None


def test_left_out_with_a_note_on_the_cpu_and_where_not_installed(monkeypatch):
    start = LadderState(candidate(device="cpu"))
    default = [r for r in DEFAULT_LADDER if r.name in LADDER]
    usable, notes = usable_rungs(default, "cpu", start)
    assert "liger-kernels" not in [r.name for r in usable]
    assert notes == ["rung liger-kernels left out: Liger's kernels are Triton kernels for GPUs, not for the CPU"]
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    usable, notes = usable_rungs(default, "cuda", LadderState(candidate()))
    assert "liger-kernels" not in [r.name for r in usable]
    assert notes == ["rung liger-kernels left out: liger-kernel is not installed (pip install 'trl-autofit[liger]')"]


def test_on_a_gpu_with_the_package_it_is_climbed(liger_installed):
    usable, notes = usable_rungs(list(DEFAULT_LADDER), "cuda", LadderState(candidate()))
    assert "liger-kernels" in [r.name for r in usable] and not any("liger" in n for n in notes)
    assert "liger_kernel" not in sys.modules  # found, not imported: the search's process loads no kernel package
    # named, it probes on the simulated device too (tests, with the stand-in)
    assert RUNGS["liger-kernels"].unavailable("cpu") is None


def test_stored_studies_keep_their_keys():
    plain = candidate()
    assert plain.key() == "810448accf3451c3"  # the key before the field existed (commit 67abddb): studies resume
    assert plain.key() != candidate(liger=True).key()
    assert Candidate.from_dict(candidate(liger=True).to_dict()).liger
    assert candidate(liger=True).describe() == "mb=4x1 len=512 liger"


# -- the search: a free rung; a machine where the kernels break goes on without them --------------------------------
def _search(tmp_path, budget, **runner_changes):
    runner = FormulaRunner(budget, act_bytes_per_token=64 * 1024, **runner_changes)
    spec = formula_spec(tmp_path, budget)
    search = Search(spec, runner, resolve_ladder(LADDER))
    return runner, search, search.run()


def test_liger_is_the_answer_when_it_makes_the_full_batch_fit(tmp_path, liger_installed):
    runner = FormulaRunner(0)
    full = candidate(micro_batch=8)
    plain, fused = runner.peak_bytes(full), runner.peak_bytes(full.replace(liger=True))
    runner, _, report = _search(tmp_path, (plain + fused) // 2)
    chosen = report.chosen.candidate
    assert chosen.liger and chosen.rungs == ("liger-kernels",) and chosen.micro_batch == 8
    assert not any(c.checkpointing for c in runner.candidates)  # nothing costlier was needed


def test_kernels_that_break_leave_the_search_to_the_other_rungs(tmp_path, liger_installed):
    def broken(cand, steps):
        if cand.liger:
            return ProbeResult(Outcome.INVALID, error="CompilationError: triton", error_phase="train",
                               cause=KERNEL_FAILURE)
        return None

    runner = FormulaRunner(0)
    full = candidate(micro_batch=8)
    budget = (runner.peak_bytes(full) + runner.peak_bytes(full.replace(liger=True))) // 2
    runner, _, report = _search(tmp_path, budget, fail_if=broken)
    assert sum(c.liger for c in runner.candidates) == 1  # one probe found out, none after it
    chosen = report.chosen.candidate
    assert not chosen.liger and "liger-kernels" not in chosen.rungs and chosen.micro_batch < 8
    assert any(n.startswith("Liger's kernels could not run here (CompilationError: triton)") for n in report.notes)


def test_export_sets_the_flag_and_says_what_it_trades(tmp_path, liger_installed):
    runner = FormulaRunner(0)
    full = candidate(micro_batch=8)
    _, _, report = _search(tmp_path, (runner.peak_bytes(full) + runner.peak_bytes(full.replace(liger=True))) // 2)
    export_write(report, tmp_path)
    text = (tmp_path / "best.yaml").read_text()
    assert "use_liger_kernel: true  # liger-kernels: Liger's fused RMSNorm, SwiGLU and RoPE" in text
    assert "liger_kernel_config: {fused_linear_cross_entropy: false}  # liger-kernels: Liger's fused" in text
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["config"]["use_liger_kernel"] is True
    assert any(t.startswith("Liger's fused RMSNorm") for t in best["trades"])


# -- the ledger -----------------------------------------------------------------------------------------------------
def test_ledger_counts_what_the_kernels_do_not_save():
    shape = mm.ModelShape.from_model("Qwen/Qwen2.5-7B")
    h, inter, layers = shape.hidden, shape.intermediate, shape.layers
    plain = candidate(model="Qwen/Qwen2.5-7B", micro_batch=1, max_length=4096)
    fused = plain.replace(liger=True)
    # bf16 on CUDA, full fine-tuning: per norm element the float32 copy (4 B) and the normalized tensor (2 B) against
    # the kept input (2 B); per MLP element act(gate) (2 B)
    per_token_layer = 4 * 2 * h + 2 * inter
    assert mm.activation_bytes_per_token_layer(shape, 2, liger=True) == pytest.approx(
        mm.activation_bytes_per_token_layer(shape, 2) - per_token_layer)
    saved = mm.predict(plain).activations - mm.predict(fused).activations
    assert saved == pytest.approx(4096 * layers * per_token_layer, rel=0.01)
    # under LoRA the norms are frozen: only the float32 copy is saved against the input
    lora = LoraSettings()
    assert mm.activation_bytes_per_token_layer(shape, 2, lora, liger=True, norms_train=False) == pytest.approx(
        mm.activation_bytes_per_token_layer(shape, 2, lora) - (2 * 2 * h + 2 * inter))
    # with checkpointing only the recomputed layer is smaller
    backward = [mm.predict(c.replace(checkpointing=True)).phase_totals["backward"] for c in (plain, fused)]
    assert 0 < backward[0] - backward[1] < saved / 10


def test_families_liger_does_not_patch_save_nothing():
    starcoder2 = mm.ModelShape.from_config({"model_type": "starcoder2", "hidden_size": 64, "num_hidden_layers": 2,
                                            "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 100})
    assert mm.activation_bytes_per_token_layer(starcoder2, 2, liger=True) == \
        mm.activation_bytes_per_token_layer(starcoder2, 2)


# -- real TRL probes on the simulated device, with the stand-in -----------------------------------------------------
def _probe(tmp_path, factory, **changes):
    from autofit.probe._worker import run_probe

    probe = ProbeSettings(steps=2, output_dir=str(tmp_path / "probe"))
    return run_probe(factory, candidate(device="cpu", probe=probe, **changes), None)


@pytest.mark.slow
@pytest.mark.floor
def test_trl_applies_the_kernels_and_the_ledger_counts_their_saving(tmp_path, liger_installed):
    from autofit.probe.algos import reward, sft

    plain = _probe(tmp_path, reward.build_trainer, algo="reward")
    fused = _probe(tmp_path, reward.build_trainer, algo="reward", liger=True)
    assert plain.outcome is Outcome.OK and fused.outcome is Outcome.OK, fused.error
    assert fused.observed["liger_modules"] == 7  # 2 layers x (2 norms + the MLP) + the final norm
    predicted = mm.predict(candidate(device="cpu", algo="reward")).total - \
        mm.predict(candidate(device="cpu", algo="reward", liger=True)).total
    assert plain.peak_bytes - fused.peak_bytes == pytest.approx(predicted, rel=0.1)

    import liger_kernel.transformers as stand_in

    stand_in.APPLIED.clear()
    assert _probe(tmp_path, sft.build_trainer, liger=True).outcome is Outcome.OK
    # the layer kernels only, on transformers 4.56 too (it applies them before TRL's own setting): TRL's fused LM head
    assert stand_in.APPLIED == [{"fused_linear_cross_entropy": False}]


@pytest.mark.slow
def test_a_trainer_without_the_flag_is_named_and_a_model_liger_skips_is_the_rungs_failure(tmp_path, liger_installed,
                                                                                           monkeypatch):
    from autofit.probe.algos import sft

    def ignores_the_candidate(cand):
        return sft.build_trainer(cand.replace(liger=False))

    result = _probe(tmp_path, ignores_the_candidate, liger=True)
    assert result.outcome is not Outcome.OK and "use_liger_kernel off" in result.error

    import liger_kernel.transformers as stand_in

    monkeypatch.setattr(stand_in, "_apply_liger_kernel_to_instance", lambda model, **kwargs: None)
    result = _probe(tmp_path, sft.build_trainer, liger=True)
    assert result.outcome is Outcome.INVALID and result.cause == KERNEL_FAILURE
    assert "Liger patched no module of this model (model_type qwen2)" in result.error


@pytest.mark.slow
def test_grpo_generates_and_trains_with_the_kernels(tmp_path, liger_installed):
    import liger_kernel.transformers as stand_in

    from autofit.probe.algos import rl

    stand_in.APPLIED.clear()
    result = _probe(tmp_path, rl.build_grpo_trainer, algo="grpo", max_length=32, num_generations=2, liger=True)
    assert result.outcome is Outcome.OK, result.error
    assert "generation" in result.phase_peaks and result.observed["liger_modules"] == 7
    assert stand_in.APPLIED == [{"fused_linear_cross_entropy": False}]  # GRPO keeps its fused LM head too
    c = candidate(device="cpu", algo="grpo", max_length=32, num_generations=2, liger=True)
    assert mm.predict(c).total == pytest.approx(result.peak_bytes, rel=0.05)


@pytest.mark.slow
def test_a_package_transformers_refuses_is_the_rungs_failure_not_bad_input(tmp_path):
    """find_spec found something, transformers' own check did not accept it (an old or broken liger-kernel): its
    ImportError would otherwise read as the trainer rejecting the configuration, exit 2 on a first probe."""
    from autofit.probe.algos import sft

    result = _probe(tmp_path, sft.build_trainer, liger=True)  # no package at all here: transformers refuses
    assert result.outcome is Outcome.INVALID and result.cause == KERNEL_FAILURE
    assert "liger-kernel" in result.error
