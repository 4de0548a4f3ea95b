"""The memory model in the search: fewer probes than bisection, the same answer; calibration; --max-probes;
headroom; `autofit estimate` through the CLI (fast: no training)."""

import json
from pathlib import Path

import pytest

from autofit import cli, memory_model
from autofit.ladder import resolve_ladder
from autofit.outcome import Outcome, ProbeResult
from autofit.search import Search
from autofit.spec import SearchSpec

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

    def run(self, candidate, steps):
        self.calls.append(candidate)
        peak = int(self.peak(candidate))
        if peak > self.budget:
            return ProbeResult(Outcome.OOM, peak_bytes=peak, error="fake OOM", error_phase="forward_backward")
        speed = 1000.0 * candidate.micro_batch / (candidate.micro_batch + 1) * (0.7 if candidate.checkpointing else 1)
        return ProbeResult(Outcome.OK, peak_bytes=peak, tokens_per_second=speed, steps=steps)


def search(tmp_path, budget_mib, predictive=True, **spec_kw):
    spec_kw.setdefault("effective_batch", 16)
    spec_kw.setdefault("max_length", 256)
    spec = SearchSpec(model="tiny-qwen2", budget_bytes=budget_mib * MiB, out_dir=tmp_path, **spec_kw)
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
    report, _ = search(tmp_path, 400)
    calibration = report.calibration
    assert calibration is not None and calibration.method == "two-term"
    assert calibration.static_scale == pytest.approx(STATIC, rel=1e-6)
    assert calibration.dynamic_scale == pytest.approx(DYNAMIC, rel=1e-6)


def test_max_probes_stops_the_search_and_still_verifies(tmp_path):
    report, runner = search(tmp_path, 150, max_probes=3)
    assert report.probe_limit_reached
    probes = [c for c in runner.calls]
    assert len([r for r in report.records if r.kind == "probe"]) == 3
    assert any("--max-probes 3" in note for note in report.notes)
    if report.fits:
        assert report.verified is not None and report.verified.peak_bytes <= 150 * MiB
    assert len(probes) <= 3 + len([r for r in report.records if r.kind == "verify"])


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

    report, _ = search(tmp_path, 400)
    export.write(report, Path(tmp_path))
    best = json.loads((Path(tmp_path) / "best.json").read_text())
    assert best["memory_model"]["method"] == "two-term"
    assert best["prediction_error"]["calibrated"]["points"] >= 2
    assert all("predicted_bytes" in c for c in best["candidates"])
    code = cli.main(["estimate", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "200MiB",
                     "--max-length", "256", "--effective-batch", "16", "--from", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "calibrated on" in out and "expected" in out


def test_estimate_bad_input_exits_2(capsys):
    code = cli.main(["estimate", "--model", "no/such-model", "--gpu-memory", "24GiB"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no/such-model" in err


def test_a_speed_rung_that_buys_no_larger_batch_is_not_chosen(tmp_path):
    from autofit.search import Fit

    base = memory_model.base_candidate(SearchSpec(model="tiny-qwen2", budget_bytes=2**30, out_dir=tmp_path))
    plain = Fit(1, base.replace(micro_batch=2, grad_accum=4), ProbeResult(Outcome.OK, tokens_per_second=100.0))
    # the same micro-batch with checkpointing, timed faster by noise
    ckpt = Fit(2, plain.candidate.replace(checkpointing=True), ProbeResult(Outcome.OK, tokens_per_second=110.0))
    bigger = Fit(2, base.replace(micro_batch=4, grad_accum=2, checkpointing=True),
                 ProbeResult(Outcome.OK, tokens_per_second=105.0))
    ranked = Search._undominated([plain, ckpt, bigger])
    assert ckpt not in ranked and plain in ranked and bigger in ranked
