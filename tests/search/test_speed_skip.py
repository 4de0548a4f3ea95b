"""Issue 37, item 3: what the throughput model predicts slower than a measured fit is not timed, and the model is
calibrated on the search's own timed steps (best.json's "speed_model", read back by ``autofit estimate --from``).
The fake device follows the memory ledger (scaled) for its peaks and the throughput model (scaled) for its speed, on
fixed rates for this machine: a world both models describe, so every expectation is derived from them. Its model is
tiny-qwen2 with 12 layers: its body outweighs its LM head, as in the models users train, so that checkpointing (which
recomputes the layers, not the head) costs the fifth of a step it costs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import spec_of

from autofit import cli, export, memory_model
from autofit.core import Outcome, ProbeResult
from autofit.rungs import resolve_ladder
from autofit.search import Search, _speed_tie

MiB = 2**20
RATES = (50e9, 10e9, 10e-6, 256.0, 0.0)  # a machine's rates as autofit.probe._rates measures them (RATE_NAMES), for a
# world whose layers' matmuls dominate: 10 µs operators, no torch-fallback head
CARD = memory_model.measured_rates_card(*RATES)
MODEL = str(Path(__file__).resolve().parents[1] / "data" / "tiny-qwen2-deep")
SHAPE = memory_model.ModelShape.from_model(MODEL)
COMPUTE, FIXED = 2.5, 4.0  # how far the device's step time is from the uncalibrated model, by part


class ModelRunner:
    """Peaks: the ledger's prior scaled; speed: the throughput model's step time with its compute and per-micro-batch
    parts scaled by COMPUTE and FIXED."""

    def __init__(self, budget):
        self.budget = budget
        self.calls = []

    @staticmethod
    def tokens_per_second(candidate) -> float:
        estimate = memory_model.predict_speed(candidate, SHAPE, CARD)
        fixed = sum(v for k, v in estimate.terms.items() if k in ("launch", "generation launches"))
        return estimate.tokens_per_step / (COMPUTE * (estimate.seconds_per_step - fixed) + FIXED * fixed)

    def run(self, candidate, steps, **plan):
        self.calls.append(candidate)
        peak = int(1.1 * memory_model.predict(candidate).total)
        if peak > self.budget:
            return ProbeResult(Outcome.OOM, peak_bytes=peak, error="fake OOM", error_phase="forward_backward")
        return ProbeResult(Outcome.OK, peak_bytes=peak, tokens_per_second=self.tokens_per_second(candidate),
                           steps=steps)


@pytest.fixture(autouse=True)
def rates(monkeypatch):
    monkeypatch.setattr(_speed_tie, "machine_rates", lambda: RATES)


def search(tmp_path, budget_mib, **spec_kw):
    spec_kw.setdefault("effective_batch", 16)
    spec_kw.setdefault("max_length", 256)
    spec = spec_of(model=MODEL, budget_bytes=budget_mib * MiB, out_dir=tmp_path, **spec_kw)
    runner = ModelRunner(spec.budget_bytes)
    return Search(spec, runner, resolve_ladder(spec.ladder)).run(), runner


def no_gate(monkeypatch):
    from autofit.search import _speed_skip

    monkeypatch.setattr(_speed_skip.SpeedGate, "skips", lambda self, level, candidate: False)


def test_a_candidate_predicted_slower_is_never_timed_and_is_recorded(tmp_path, monkeypatch):
    report, runner = search(tmp_path / "gate", 900)
    assert report.speed_skipped, "the checkpointing level's candidates are predicted slower than the plain fit"
    timed = {c.key() for c in runner.calls}
    for skip in report.speed_skipped:
        assert skip.candidate.key() not in timed  # never probed
        assert skip.predicted_tps < (1 - skip.band) * skip.than_predicted_tps
        assert skip.candidate.checkpointing and not skip.than.checkpointing
        # the device agrees: it would have lost
        assert ModelRunner.tokens_per_second(skip.candidate) < ModelRunner.tokens_per_second(skip.than)
    assert report.speed_model is not None and report.speed_model.points >= 1
    assert report.speed_skipped[0].band == report.speed_model.uncertainty
    note = next(n for n in report.notes if n.startswith("not timed, predicted slower"))
    assert f"{len(report.speed_skipped)} candidate(s)" in note and "--no-predict times them" in note
    export.write(report, tmp_path / "gate")
    best = json.loads((tmp_path / "gate" / "best.json").read_text())
    listed = [s["candidate"] for s in best["skipped_by_speed"]]
    assert listed == [s.candidate.describe() for s in report.speed_skipped]
    assert not set(listed) & {c["candidate"] for c in best["candidates"]}  # not a failure: not a probe at all
    assert not set(listed) & {s["candidate"] for s in best["skipped"]}  # nor a memory skip
    # the same search without the gate times them, and chooses the same configuration
    no_gate(monkeypatch)
    without, plain_runner = search(tmp_path / "plain", 900)
    assert not without.speed_skipped
    assert without.chosen.candidate.key() == report.chosen.candidate.key()
    assert len(runner.calls) < len(plain_runner.calls)
    assert {s.candidate.key() for s in report.speed_skipped} & {c.key() for c in plain_runner.calls}


def test_the_rule_is_off_under_no_predict(tmp_path):
    gated, _ = search(tmp_path / "gate", 900)
    skipped = {s.candidate.key() for s in gated.speed_skipped}
    report, runner = search(tmp_path / "off", 900, predict=False)
    assert report.speed_skipped == [] and report.speed_model is None
    assert skipped & {c.key() for c in runner.calls}  # what the gate skipped is timed without the model
    assert not any(n.startswith("not timed, predicted slower") for n in report.notes)


def test_a_level_skipped_for_speed_still_climbs_to_faster_values(tmp_path):
    """A skipped value is not a value that does not fit: the search goes up from it (a larger micro-batch may be
    faster), never down (smaller ones are slower still)."""
    report, runner = search(tmp_path, 900)
    for skip in report.speed_skipped:
        assert not [c for c in runner.calls
                    if c.rungs == skip.candidate.rungs and c.micro_batch < skip.candidate.micro_batch]


def test_two_timed_micro_batch_sizes_pin_both_terms():
    base = memory_model.base_candidate(spec_of(model=MODEL, budget_bytes=2**30, effective_batch=16,
                                               max_length=256))
    points = [(base.replace(micro_batch=mb, grad_accum=16 // mb), ModelRunner.tokens_per_second(
        base.replace(micro_batch=mb, grad_accum=16 // mb))) for mb in (1, 4)]
    two = memory_model.calibrate_speed(points, SHAPE, CARD)
    assert two.method == "two-term" and two.points == 2
    assert two.compute_scale == pytest.approx(COMPUTE, rel=1e-6) and two.fixed_scale == pytest.approx(FIXED, rel=1e-6)
    other = base.replace(micro_batch=8, grad_accum=2, checkpointing=True)
    assert two.predict(other, SHAPE, CARD).tokens_per_second == pytest.approx(ModelRunner.tokens_per_second(other))
    one = memory_model.calibrate_speed(points[:1], SHAPE, CARD)
    assert one.method == "scale" and one.uncertainty == pytest.approx(0.20)
    assert one.predict(points[0][0], SHAPE, CARD).tokens_per_second == pytest.approx(points[0][1])
    assert memory_model.calibrate_speed([], SHAPE, CARD).uncertainty == memory_model.PRIOR_SPEED_UNCERTAINTY


def test_the_calibration_round_trips_through_best_json_and_estimate_applies_it(tmp_path, capsys):
    report, _ = search(tmp_path, 1200)  # two micro-batch sizes timed: both terms
    assert report.speed_model is not None and report.speed_model.method == "two-term"
    export.write(report, tmp_path)
    stored = json.loads((tmp_path / "best.json").read_text())["speed_model"]
    loaded = memory_model.SpeedCalibration.from_dict(stored)
    assert loaded == report.speed_model and loaded.card_of() == CARD
    code = cli.main(["estimate", "--model", MODEL, "--device", "cpu", "--gpu-memory", "1200MiB",
                     "--max-length", "256", "--effective-batch", "16", "--from", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "tok/s calibrated on" in out and f"±{loaded.uncertainty:.0%}" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("lvl "))
    assert lines[header].split()[-1] == "tok/s"
    base = memory_model.base_candidate(spec_of(model=MODEL, budget_bytes=1200 * MiB, effective_batch=16,
                                               max_length=256))
    assert base.micro_batch == 16 and lines[header + 1].split()[0] == "0"
    printed = float(lines[header + 1].split()[-1].replace(",", ""))
    assert printed == pytest.approx(ModelRunner.tokens_per_second(base), rel=0.01)  # the device, not the prior
    prior = memory_model.predict_speed(base, SHAPE, CARD).tokens_per_second
    assert abs(printed / prior - 1) > 0.5
    # made for another device: not applied, and said
    code = cli.main(["estimate", "--model", MODEL, "--gpu-memory", "H100", "--max-length", "256",
                     "--effective-batch", "16", "--from", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "throughput model was calibrated for device cpu" in out and "uncalibrated" in out
