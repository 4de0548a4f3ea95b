"""The terminal's table: one row per probe, what was stored, what was not probed."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from autofit.core import format_size
from autofit.search import SearchReport, over_margin


def _outcome_cell(result, budget: Optional[int] = None, margin: float = 0.0) -> str:
    """OOM with the phase that ran out (the optimizer step, generation, ...): where the memory went; a fit of the
    budget that the margin rejected, with by how much."""
    if result.outcome.value == "OOM" and result.error_phase:
        return f"OOM in {result.error_phase}"
    over = over_margin(result, budget, budget * (1 - margin)) if budget is not None else None
    if over is not None:
        return f"OK, over the margin by {format_size(over)}"
    return result.outcome.value


def table_text(report: SearchReport) -> str:
    """One row per probe. tok/s is training throughput (prompt and completion tokens per second of whole steps);
    for RL, gen tok/s is the generation phase alone (completion tokens per second of generation)."""
    generation = any(r.result.generation_tokens_per_second for r in report.records)
    header = ("#", "kind", "rungs", "candidate", "outcome", "peak", "tok/s") + (("gen tok/s",) if generation else ())
    rows: List[Tuple[str, ...]] = [header]
    for index, r in enumerate(report.records, 1):
        row: Tuple[str, ...] = (
            str(index), ("refine" if r.stage == "refine" else r.kind) + ("*" if r.cached else ""),
            "+".join(r.candidate.rungs) or "baseline", r.candidate.describe(),
            _outcome_cell(r.result, report.spec.budget_bytes, report.margin),
            format_size(r.result.peak_bytes), f"{r.result.tokens_per_second:,.0f}" if r.result.fits else "-",
        )
        if generation:
            rate = r.result.generation_tokens_per_second
            row += (f"{rate:,.0f}" if r.result.fits and rate else "-",)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any(r.cached for r in report.records):
        lines.append("* stored: measured by an earlier run of this search (same --out), not repeated")
    if report.skipped:
        lines.append("not probed, predicted over the budget even at the low end of the model's error band: "
                     + "; ".join(f"{s.candidate.describe()} ({format_size(s.predicted_bytes)} ± {s.uncertainty:.0%})"
                                 for s in report.skipped))
    return "\n".join(lines)


def summary_lines(report: SearchReport, answer: Any = None) -> List[str]:
    """The terminal's last lines for a fit: the answer (as trained; ``report.answer``, as written, where not given),
    its verified peak and speed, and its files."""
    answer, verified, spec = answer or report.answer, report.verified, report.spec
    assert answer is not None and verified is not None  # rendered for a written fit
    chosen = answer.candidate
    out = spec.options.out_dir
    side = report.side_by_side
    lines = [
        f"best: {chosen.describe()} [{', '.join(chosen.rungs) or 'no rung needed'}], "
        f"verified peak {format_size(verified.peak_bytes)} of {format_size(spec.budget_bytes)} over "
        f"{verified.steps} steps, {verified.tokens_per_second:,.0f} tok/s"
        + (f" ({verified.generation_tokens_per_second:,.0f} tok/s generating)"
           if verified.generation_tokens_per_second else "") + "; "
        f"{report.probes_run} new probes, {sum(r.cached for r in report.records)} reused from {out}"
        + (f"; {'handed out to' if side.get('workers') else 'side by side on'} {len(side['devices'])} "
           f"{'workers' if side.get('workers') else 'devices'}, {side['rounds']} rounds of probes" if side else ""),
        f"wrote {out / 'best.yaml'} and {out / 'best.json'}",
    ]
    if (out / "report.html").exists():
        lines.append(f"report: {out / 'report.html'}")
    return lines
