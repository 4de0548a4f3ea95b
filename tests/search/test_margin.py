"""Headroom from evidence (autofit.search._margin): a better fit that only the margin rejected is verified, and kept or
rejected by what the verification shows; the table says by how much a fit missed the margin. The H100 case of
2026-11-22 at fake-runner scale: a full fine-tune with an 8-bit optimizer fitted 60 MB inside the 3% margin and
the answer fell to LoRA."""

from __future__ import annotations

from pathlib import Path

from fakes import spec_of

from autofit.core import Candidate, Outcome, ProbeResult
from autofit.export import table_text
from autofit.rungs import resolve_ladder
from autofit.search import Search
from autofit.search._margin import evidence, over_margin

try:
    from fakes import FormulaRunner, MiB
except ImportError:  # tests/ became a package
    from tests.fakes import FormulaRunner, MiB

EIGHT_BIT = "adamw_bnb_8bit"
LADDER = ["micro-batch", "checkpointing", "optimizer-8bit", "lora"]
HEADROOM = 0.03


def eight_bit_peak(runner: FormulaRunner) -> int:
    """The lightest full fine-tune of the ladder: micro-batch 1, checkpointing, 8-bit AdamW."""
    return runner.peak_bytes(Candidate(algo="sft", model="tiny-qwen2", device="cuda", micro_batch=1, grad_accum=8,
                                       max_length=512, checkpointing=True, optim=EIGHT_BIT))


def search(tmp_path, runner: FormulaRunner, budget: int):
    runner.budget_bytes = budget
    spec = spec_of(model="tiny-qwen2", budget_bytes=budget, out_dir=Path(tmp_path), device="cuda", max_length=512,
                      effective_batch=8, verify_steps=10, headroom=HEADROOM, predict=False, ladder=LADDER)
    return Search(spec, runner, resolve_ladder(LADDER)).run()


def inside_the_margin_budget(runner: FormulaRunner) -> int:
    """A budget the 8-bit full fine-tune fits, but not its 3% margin (half of it is left)."""
    return int(eight_bit_peak(runner) / (1 - HEADROOM / 2))


def test_a_fit_rejected_only_by_the_margin_is_verified_and_kept(tmp_path):
    runner = FormulaRunner(1, weight_bytes=100 * MiB)
    report = search(tmp_path, runner, inside_the_margin_budget(runner))
    chosen = report.chosen.candidate
    assert chosen.optim == EIGHT_BIT and chosen.lora is None  # full fine-tuning kept, not LoRA
    assert report.verified.fits and report.verified.peak_bytes <= report.spec.budget_bytes
    note = next(n for n in report.notes if "but not the margin" in n)
    assert "kept on that evidence" in note and "drift 0 B" in note and "0 allocator retries" in note
    assert "OK, over the margin by" in table_text(report)


def test_drift_in_the_verification_rejects_it(tmp_path):
    runner = FormulaRunner(1, weight_bytes=100 * MiB)
    budget = inside_the_margin_budget(runner)
    runner.verify_extra_bytes = (budget - eight_bit_peak(runner)) // 2 + 1  # fits once, not with the drift again
    report = search(tmp_path, runner, budget)
    assert report.chosen.candidate.lora is not None
    note = next(n for n in report.notes if "but not the margin" in n)
    assert "with that drift once more it would reach" in note and note.endswith("rejected")


def test_allocator_retries_reject_it(tmp_path):
    runner = FormulaRunner(1, weight_bytes=100 * MiB)
    budget = inside_the_margin_budget(runner)

    def retries_on_verification(candidate, steps):
        if steps >= 10 and candidate.optim == EIGHT_BIT and candidate.lora is None:
            peak = runner.peak_bytes(candidate, steps)
            return ProbeResult(Outcome.OK, peak_bytes=peak, steps=steps, tokens_per_second=1.0,
                               stats={"alloc_retries": 3})
        return None

    runner.fail_if = retries_on_verification
    report = search(tmp_path, runner, budget)
    assert report.chosen.candidate.lora is not None
    assert any("3 allocator retries: the allocator is already short, rejected" in n for n in report.notes)


def test_nothing_over_the_margin_changes_nothing(tmp_path):
    runner = FormulaRunner(1, weight_bytes=100 * MiB, act_bytes_per_token=256 * 1024)  # micro-batch 2 is far over
    report = search(tmp_path, runner, int(eight_bit_peak(runner) / (1 - HEADROOM) * 1.01))
    assert report.chosen.candidate.optim == EIGHT_BIT and report.chosen.candidate.lora is None
    assert not any("but not the margin" in n for n in report.notes)
    assert len([r for r in report.records if r.kind == "verify"]) == 1


def test_evidence_rules():
    probe = ProbeResult(Outcome.OK, peak_bytes=980, steps=2)
    assert over_margin(probe, 1000, 970.0) == 10 and over_margin(probe, 1000, 990.0) is None
    assert over_margin(probe, 900, 870.0) is None  # over the budget itself: not a fit
    kept, note = evidence(probe, ProbeResult(Outcome.OK, peak_bytes=985, steps=10), 1000, 970.0)
    assert kept and "drift 5 B" in note
    kept, note = evidence(probe, ProbeResult(Outcome.OK, peak_bytes=995, steps=10), 1000, 970.0)
    assert not kept and "would reach 1010 B" in note  # 995 + 15 of drift
    kept, note = evidence(probe, ProbeResult(Outcome.OOM, peak_bytes=1001, steps=4), 1000, 970.0)
    assert not kept and "its verification did not fit (OOM)" in note
