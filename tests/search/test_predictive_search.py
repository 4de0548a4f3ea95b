"""The memory model in the search: fewer probes than bisection, the same answer; calibration; --max-probes;
headroom; `autofit estimate` through the CLI (fast: no training)."""

import json
from pathlib import Path

import pytest
from fakes import spec_of

from autofit import cli, memory_model
from autofit.core import Outcome, ProbeResult
from autofit.rungs import resolve_ladder
from autofit.search import Search, undominated

MiB = 2**20
STATIC, DYNAMIC = 1.2, 0.85  # how far the "real" device is from the uncalibrated ledger


class LedgerRunner:
    """A fake device whose peak is the ledger's prior with its static and dynamic parts scaled: a world the
    memory model can learn exactly, so tests can compare the predictive search with plain bisection."""

    def __init__(self, budget):
        self.budget = budget
        self.calls = []

    def peak(self, candidate):
        ledgers = memory_model.phase_ledgers(candidate)
        return max(STATIC * ledger.static + DYNAMIC * ledger.dynamic for ledger in ledgers)

    def run(self, candidate, steps, **plan):
        self.calls.append(candidate)
        peak = int(self.peak(candidate))
        if peak > self.budget:
            return ProbeResult(Outcome.OOM, peak_bytes=peak, error="fake OOM", error_phase="forward_backward")
        speed = 1000.0 * candidate.micro_batch / (candidate.micro_batch + 1) * (0.7 if candidate.checkpointing else 1)
        return ProbeResult(Outcome.OK, peak_bytes=peak, tokens_per_second=speed, steps=steps)


def search(tmp_path, budget_mib, predictive=True, **spec_kw):
    spec_kw.setdefault("effective_batch", 16)
    spec_kw.setdefault("max_length", 256)
    spec = spec_of(model="tiny-qwen2", budget_bytes=budget_mib * MiB, out_dir=tmp_path, **spec_kw)
    runner = LedgerRunner(spec.budget_bytes)
    engine = Search(spec, runner, resolve_ladder(spec.ladder))
    if not predictive:
        engine.shape = None  # no memory model: plain bisection
    return engine.run(), runner


@pytest.mark.parametrize("budget_mib", [150, 250, 400, 700, 1500])
def test_predictive_search_same_answer_fewer_probes(tmp_path, budget_mib):
    predicted, predictive_runner = search(tmp_path / "model", budget_mib)
    bisected, bisection_runner = search(tmp_path / "bisect", budget_mib, predictive=False)
    assert predicted.fits == bisected.fits
    if predicted.fits:
        assert predicted.chosen.candidate.key() == bisected.chosen.candidate.key()
    assert len(predictive_runner.calls) <= len(bisection_runner.calls)


def test_predictive_search_saves_probes_overall(tmp_path):
    saved = 0
    for budget_mib in (150, 250, 400, 700):
        _, with_model = search(tmp_path / f"m{budget_mib}", budget_mib)
        _, without = search(tmp_path / f"b{budget_mib}", budget_mib, predictive=False)
        saved += len(without.calls) - len(with_model.calls)
    assert saved >= 4


def test_calibration_recovers_the_devices_scales(tmp_path):
    report, _ = search(tmp_path, 700, max_probes=10)  # refinement probes other micro-batches: several token counts
    assert len({r.candidate.micro_batch for r in report.records if r.result.fits}) >= 2
    calibration = report.calibration
    assert calibration is not None and calibration.method == "two-term"
    assert calibration.static_scale == pytest.approx(STATIC, rel=1e-6)
    assert calibration.dynamic_scale == pytest.approx(DYNAMIC, rel=1e-6)


def test_max_probes_stops_the_search_and_still_verifies(tmp_path):
    report, runner = search(tmp_path, 150, max_probes=2)  # the walk alone needs 3 probes here
    assert report.probe_limit_reached
    probes = [c for c in runner.calls]
    assert len([r for r in report.records if r.kind == "probe"]) == 2
    assert any("--max-probes 2" in note for note in report.notes)
    if report.fits:
        assert report.verified is not None and report.verified.peak_bytes <= 150 * MiB
    assert len(probes) <= 2 + len([r for r in report.records if r.kind == "verify"])


def test_headroom_rejects_fits_too_close_to_the_budget(tmp_path):
    tight, _ = search(tmp_path / "none", 300, headroom=0.0)
    assert tight.fits
    peak = tight.chosen.result.peak_bytes
    budget_mib = peak / MiB / 0.99  # the chosen config uses 99% of this budget
    spec_budget = int(budget_mib) + 1
    roomy, _ = search(tmp_path / "ten", spec_budget, headroom=0.10)
    assert roomy.fits
    assert roomy.chosen.result.peak_bytes <= spec_budget * MiB * 0.90


def test_best_json_carries_the_model_and_estimate_reads_it(tmp_path, capsys):
    from autofit import export

    report, _ = search(tmp_path, 700, max_probes=10)
    export.write(report, Path(tmp_path))
    best = json.loads((Path(tmp_path) / "best.json").read_text())
    assert best["memory_model"]["method"] == "two-term"
    assert best["prediction_error"]["calibrated"]["points"] >= 2
    assert all("predicted_bytes" in c for c in best["candidates"])
    refined = [c for c in best["candidates"] if c["stage"] == "refine"]
    assert refined and len(refined) == len([r for r in report.records if r.stage == "refine"])
    assert best["margin"] == round(report.margin, 4)
    assert [s["candidate"] for s in best["skipped"]] == [s.candidate.describe() for s in report.skipped]
    table = export.table_text(report).splitlines()
    assert sum(line.split()[1] == "refine" for line in table[2:] if line[:1].isdigit()) == len(refined)
    code = cli.main(["estimate", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "200MiB",
                     "--max-length", "256", "--effective-batch", "16", "--from", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "calibrated on" in out and "\nuse: level " in out


def test_estimate_bad_input_exits_2(capsys):
    code = cli.main(["estimate", "--model", "no/such-model", "--gpu-memory", "24GiB"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no/such-model" in err


def test_a_speed_rung_that_buys_no_larger_batch_is_not_chosen(tmp_path):
    from autofit.search import Fit

    base = memory_model.base_candidate(spec_of(model="tiny-qwen2", budget_bytes=2**30, out_dir=tmp_path))
    plain = Fit(1, base.with_rung("micro-batch", micro_batch=2, grad_accum=4),
                ProbeResult(Outcome.OK, tokens_per_second=100.0))
    # the same micro-batch with checkpointing, timed faster by noise
    ckpt = Fit(2, plain.candidate.with_rung("checkpointing", checkpointing=True),
               ProbeResult(Outcome.OK, tokens_per_second=110.0))
    bigger = Fit(2, ckpt.candidate.replace(micro_batch=4, grad_accum=2),
                 ProbeResult(Outcome.OK, tokens_per_second=105.0))
    ranked = undominated([plain, ckpt, bigger])
    assert ckpt not in ranked and plain in ranked and bigger in ranked


# -- skipping what the model rules out --------------------------------------------------------------------------
@pytest.mark.parametrize("budget_mib", [100, 150, 250, 400, 700])
def test_skipped_candidates_are_never_ones_that_fit(tmp_path, budget_mib):
    report, runner = search(tmp_path, budget_mib)
    probed = {c.key() for c in runner.calls}
    assert report.skipped, "a budget below the baseline's peak has candidates predicted far over it"
    for skip in report.skipped:
        assert skip.candidate.key() not in probed
        assert runner.peak(skip.candidate) > budget_mib * MiB  # the device agrees: it would not have fitted
        assert skip.predicted_bytes * (1 - skip.uncertainty) > budget_mib * MiB


def test_a_level_whose_lightest_candidate_is_ruled_out_costs_no_probe(tmp_path):
    # 90 MiB: only LoRA fits (the full-parameter levels' micro-batch 1 needs 122 MiB and more, over 90 MiB even
    # 25% below the prediction)
    report, runner = search(tmp_path, 90)
    assert report.fits and "lora" in report.chosen.candidate.rungs
    full_parameter = {level for level, state in enumerate(report.levels) if state.candidate.lora is None}
    assert not [r for r in report.records if r.level in full_parameter]
    skipped_levels = {s.level for s in report.skipped}
    assert full_parameter <= skipped_levels
    # the LoRA level, the levels rebuilt without the rungs it did not need, and the verification: all LoRA
    assert all(c.lora is not None for c in runner.calls)


def test_nothing_probed_when_the_model_rules_everything_out(tmp_path):
    from autofit._api import no_fit_message

    report, runner = search(tmp_path, 60)
    assert not report.fits and runner.calls == []
    assert {s.level for s in report.skipped} == set(range(len(report.levels)))  # every level ruled out
    message = no_fit_message(report)
    assert "nothing was probed" in message and "--no-predict" in message


def test_a_custom_trainer_is_probed_before_the_model_is_trusted(tmp_path):
    report, runner = search(tmp_path, 250, factory="tests.probe_factories:sft_factory")
    first = runner.calls[0]
    assert first.micro_batch == 16  # the baseline: the prior alone does not skip a trainer it does not describe
    assert report.fits
    assert not any(s.candidate.key() == first.key() for s in report.skipped)


# -- the margin follows the model's measured error --------------------------------------------------------------
class NoisyLedgerRunner(LedgerRunner):
    """The ledger's world plus memory the model cannot explain: +6% at micro-batch 1."""

    def peak(self, candidate):
        return super().peak(candidate) * (1.06 if candidate.micro_batch == 1 else 1.0)


def test_margin_grows_with_the_models_measured_error_and_a_fit_outside_it_needs_evidence(tmp_path):
    # 460 MiB: 4x4 fits at 98% of the budget; refinement (--max-probes) then measures micro-batch 1 about 6% over
    # the calibrated model's prediction, which leaves 4x4 inside the budget but outside the margin
    spec = spec_of(model="tiny-qwen2", budget_bytes=460 * MiB, out_dir=tmp_path, effective_batch=16,
                      max_length=256, max_probes=12)
    runner = NoisyLedgerRunner(spec.budget_bytes)
    report = Search(spec, runner, resolve_ladder(None)).run()
    calibrated = [r for r in report.records if r.kind == "probe" and r.calibration == "two-term" and r.result.fits]
    worst = max((r.result.peak_bytes - r.predicted_bytes) / r.result.peak_bytes for r in calibrated)
    assert report.margin == pytest.approx(worst) and report.margin > 0.04
    limit = spec.budget_bytes * (1 - report.margin)
    assert any(r.result.fits and limit < r.result.peak_bytes <= spec.budget_bytes for r in report.records)
    # the choice: the faster fit outside the margin was verified (autofit.search._margin): its verification shows no
    # drift, so it is kept, and the note says by how much it missed the margin and why it stays
    within_budget = [r for r in report.records if r.kind == "probe" and r.result.fits
                     and r.result.peak_bytes <= spec.budget_bytes and report.levels[r.level].cost == "speed"]
    assert report.chosen.result.tokens_per_second == max(r.result.tokens_per_second for r in within_budget)
    assert limit < report.chosen.result.peak_bytes <= spec.budget_bytes
    assert report.verified.peak_bytes <= spec.budget_bytes
    assert any(n.startswith(report.chosen.candidate.describe()) and "kept on that evidence" in n for n in report.notes)


def test_a_model_that_overestimates_adds_no_margin(tmp_path):
    class GenerousLedgerRunner(LedgerRunner):  # the device needs 6% less than the model says with checkpointing
        def peak(self, candidate):
            return super().peak(candidate) * (0.94 if candidate.checkpointing else 1.0)

    spec = spec_of(model="tiny-qwen2", budget_bytes=460 * MiB, out_dir=tmp_path, effective_batch=16,
                      max_length=256)
    engine = Search(spec, GenerousLedgerRunner(spec.budget_bytes), resolve_ladder(None))
    engine.speed.compare = lambda fits, cost: None  # time the checkpointing level too (not skipped as slower)
    report = engine.run()
    assert any(r.calibrated and r.candidate.checkpointing for r in report.records)
    assert report.margin == pytest.approx(0.0, abs=1e-9)


# -- refinement within --max-probes -----------------------------------------------------------------------------
class SmallBatchFastRunner(LedgerRunner):
    """Throughput that peaks at micro-batch 2 (think padding): the walk's largest fit is not the fastest."""

    def run(self, candidate, steps, **plan):
        result = super().run(candidate, steps)
        if result.outcome is Outcome.OK:
            result.tokens_per_second = {2: 2000.0}.get(candidate.micro_batch, 1000.0)
        return result


def refined(tmp_path, max_probes, runner_class=SmallBatchFastRunner):
    spec = spec_of(model="tiny-qwen2", budget_bytes=700 * MiB, out_dir=tmp_path, effective_batch=16,
                      max_length=256, max_probes=max_probes)
    runner = runner_class(spec.budget_bytes)
    return Search(spec, runner, resolve_ladder(None)).run(), runner


def test_refinement_spends_the_probes_left_and_finds_the_faster_fit(tmp_path):
    walk_only, _ = search(tmp_path / "walk", 700)
    assert walk_only.chosen.candidate.micro_batch == 4  # the largest fit
    report, runner = refined(tmp_path / "refine", max_probes=10)
    refine_records = [r for r in report.records if r.stage == "refine"]
    assert refine_records
    assert len([r for r in report.records if r.kind == "probe"]) <= 10
    assert report.chosen.candidate.micro_batch == 2 and report.chosen.candidate.rungs == ("micro-batch",)
    assert any("refinement" in note for note in report.notes)
    # every refinement probe is in the winning (speed) class, at the full length, and was not known before
    for r in refine_records:
        assert report.levels[r.level].cost == "speed" and r.candidate.max_length == 256


def test_refinement_respects_a_tight_probe_budget(tmp_path):
    report, runner = refined(tmp_path, max_probes=4)
    probes = [r for r in report.records if r.kind == "probe"]
    assert len(probes) <= 4
    assert report.verified is not None and report.verified.fits


def test_refinement_resumes_without_new_probes(tmp_path):
    first, first_runner = refined(tmp_path, max_probes=8)
    again, again_runner = refined(tmp_path, max_probes=8)
    assert again_runner.calls == []  # the seeded sampler asks the same questions; every answer is stored
    assert again.chosen.candidate.key() == first.chosen.candidate.key()


def test_no_refinement_without_max_probes(tmp_path):
    report, _ = search(tmp_path, 700)
    assert not [r for r in report.records if r.stage == "refine"]


def test_refine_answers_every_point_once_and_never_a_known_one():
    from autofit.core import Candidate
    from autofit.search._refine import refine

    space = {(level, mb): Candidate(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=mb, grad_accum=8 // mb,
                                    max_length=64)
             for level in (1, 2) for mb in (1, 2, 4, 8)}
    known = {(1, 4): (900.0, -1.0), (1, 8): (0.0, 5.0)}
    asked = []

    def evaluate(level, candidate):
        asked.append((level, candidate.micro_batch))
        return (100.0 * candidate.micro_batch, -1.0) if candidate.micro_batch < 8 else (0.0, 3.0)

    answers = refine(space, known, evaluate)
    assert set(answers) == set(space)
    assert len(asked) == len(set(asked)) == len(space) - len(known)
    assert not set(asked) & set(known)
    assert refine(space, answers, evaluate) == answers and len(asked) == len(space) - len(known)


class FullBatchLightRunner(LedgerRunner):
    """A device that runs the full batch (no accumulation) 15% under the model's prediction."""

    def peak(self, candidate):
        return super().peak(candidate) * (0.85 if candidate.grad_accum == 1 else 1.0)


def test_the_full_batch_is_tried_when_accumulation_makes_the_small_ones_heavier(tmp_path):
    # Short sequences: micro-batch 1 with accumulation needs more than the full batch (its gradients stay resident
    # while the next micro-batch runs). At the checkpointing level micro-batch 1 does not fit, the model puts the
    # full batch over the budget too, yet it fits: a search that gives the level up climbs to a quality rung.
    spec = spec_of(model="tiny-qwen2", budget_bytes=89 * MiB, out_dir=tmp_path, effective_batch=4, max_length=16)
    runner = FullBatchLightRunner(spec.budget_bytes)
    report = Search(spec, runner, resolve_ladder(None)).run()
    smallest = report.chosen.candidate.replace(micro_batch=1, grad_accum=4)
    assert runner.peak(smallest) > spec.budget_bytes
    assert memory_model.predict(report.chosen.candidate).total > spec.budget_bytes
    chosen = report.chosen.candidate
    assert (chosen.micro_batch, chosen.checkpointing, chosen.optim, chosen.lora) == (4, True, None, None)
    assert report.levels[report.chosen.level].cost == "speed"


def test_a_stored_result_far_from_the_model_is_measured_again(tmp_path):
    import re

    from autofit.search import STUDY_FILE

    first, _ = search(tmp_path, 250)
    journal = tmp_path / STUDY_FILE
    text = journal.read_text()
    edited, count = re.subn(r'"peak_bytes": ?\d+', '"peak_bytes":1', text, count=1)  # "it fitted in 1 byte"
    assert count == 1
    journal.write_text(edited)
    second, runner = search(tmp_path, 250)
    assert len(runner.calls) == 1  # that probe, and only it, ran again
    assert second.chosen.candidate.key() == first.chosen.candidate.key()
    assert all(r.result.peak_bytes > 1 for r in second.records)
