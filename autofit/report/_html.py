"""``report.html``: one self-contained page (inline SVG, inline CSS, no script, no network) that shows a search's
answer, why, and the measurements behind it. Written with every search and again by ``autofit report DIR``."""

from __future__ import annotations

import html
import logging
from functools import partial
from pathlib import Path
from typing import Any, Callable, List, Optional

from autofit.core import format_size
from autofit.machine import atomic_write_text
from autofit.memory_model import TERM_GROUPS
from autofit.report import _plots as plots
from autofit.report._data import ReportData, gather
from autofit.report._why import Run, why
from autofit.search import STUDY_FILE

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85rem; }
td, th { padding: 0.2rem 0.6rem; border-bottom: 1px solid #eee; }
td.num { text-align: right; font-variant-numeric: tabular-nums; } .OOM { color: #b00; } .OK { color: #070; }
td.num, th, .nb { white-space: nowrap; } svg { max-width: 100%; height: auto; }
.scroll { overflow-x: auto; max-width: 100%; } .figure.narrow { display: none; }
@media (max-width: 48rem) {
  body { margin: 1rem auto; } .figure.wide { display: none; } .figure.narrow { display: block; }
}
.caption { color: #555; font-size: 0.9rem; margin-top: 0; }
code { background: #f4f4f4; padding: 0 0.2rem; overflow-wrap: anywhere; }
.answer { font-size: 1.05rem; background: #f6f8fa; padding: 0.8rem; }
"""


def _e(value) -> str:
    """Every value drawn into the page goes through here: best.json and the study are files anyone can edit."""
    return html.escape(str(value))


def _size(value: Optional[float]) -> str:
    return format_size(value) if value else "-"


def answer_section(data: ReportData) -> List[str]:
    best = data.best
    budget = best.get("budget_bytes")
    parts = [f"<h1>autofit: {_e(best['algo'])} {_e(best['model'])} on {_e(best.get('gpu') or best['device'])}, "
             f"budget {_e(_size(budget))}</h1>"]
    if best.get("fits"):
        verify = _verified(best)
        rungs = ", ".join(best.get("rungs") or []) or "no rung needed"
        speed = best.get("tokens_per_second") or 0
        parts.append(f"<p class='answer'>Best: <b>{_e(verify['candidate'])}</b> [{_e(rungs)}], verified peak "
                     f"<b>{_e(_size(best['verified']['peak_bytes']))}</b> of {_e(_size(budget))} over "
                     f"{_e(best['verified']['steps'])} steps, {_e(f'{speed:,.0f}')} tokens/s. "
                     f"Written to <code>best.yaml</code> and <code>best.json</code>.</p>")
        trades = best.get("trades") or []
        parts.append("<h2>What each rung cost</h2>")
        parts.append("<ul>" + "".join(f"<li>{_e(t)}</li>" for t in trades) + "</ul>" if trades else
                     "<p>Nothing was traded: the configuration as asked fits.</p>")
    else:
        smallest = best.get("smallest_oom_peak_bytes")
        parts.append(f"<p class='answer'>Nothing fits {_e(_size(budget))}, even at the last rung"
                     + (f"; the lightest configuration that ran out of memory peaked at {_e(_size(smallest))}"
                        if smallest else "") + ".</p>")
    notes = best.get("notes") or []
    if notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    return parts


def _verified(best) -> dict:
    """best.json's record of the verification run of the chosen configuration (named in "verified" since a tie
    within noise verifies two; an older best.json's last verification)."""
    runs = [record for record in best["candidates"] if record["kind"] == "verify"]
    chosen = (best.get("verified") or {}).get("candidate")
    return next((record for record in reversed(runs) if record["candidate"] == chosen), runs[-1])


def _figure(draw: Callable[..., Any]) -> str:
    """A figure drawn twice: at a laptop's width, and at a phone's, where the wide one shrunk to the screen draws its
    text at 6 px; the page's style shows the one that fits the window (no script)."""
    return (f"<div class='figure wide'>{plots.svg(draw())}</div>"
            f"<div class='figure narrow'>{plots.svg(draw(width=plots.NARROW))}</div>")


def _table(html_rows: str) -> str:
    """A table in a box of its own that scrolls sideways where the window is narrower than it: the page does not."""
    return f"<div class='scroll'><table>{html_rows}</table></div>"


def figures_section(data: ReportData) -> List[str]:
    best = data.best
    budget, margin = best.get("budget_bytes"), float(best.get("margin") or 0.0)
    parts = ["<h2>Peak against " + ("length" if data.axis == "max_length" else "micro-batch") + "</h2>"]
    series = []
    for level in sorted({p.level for p in data.probes}):
        points = [(getattr(p.candidate, data.axis), p.peak_bytes, p.outcome) for p in data.probes
                  if p.level == level and p.outcome in ("OK", "OOM") and p.peak_bytes]
        series.append({"label": data.level_label(level), "points": points, "curve": data.curves.get(level, [])})
    parts.append(_figure(partial(plots.peaks_figure, series, data.axis.replace("_", "-"), budget, margin)))
    parts.append("<p class='caption'>Dots: probes that fitted; crosses: out of memory (each level's a little aside, "
                 "stopped where they ran out). Lines: the memory model calibrated on the level's own probes.</p>")
    verified = (best.get("verified") or {}).get("phase_peaks") or {}
    if verified:
        parts += ["<h2>The chosen configuration, phase by phase</h2>",
                  _figure(partial(plots.phases_figure, verified, budget, margin)),
                  "<p class='caption'>The peak of each phase of a step, measured in its verification run.</p>"]
    if data.ledger:
        parts += [f"<h2>The memory model's ledger for it (at its peak phase, {_e(data.ledger_phase)})</h2>",
                  _figure(partial(plots.ledger_figure, [("chosen", data.ledger)], budget, "Predicted peak by term")),
                  _ledger_table(data)]
    runs = [Run(p.candidate.describe(), tuple(p.candidate.rungs), p.kind, p.peak_bytes, p.tokens_per_second)
            for p in data.probes if p.outcome == "OK" and p.tokens_per_second > 0]
    if runs:
        chosen = _verified(best)["candidate"] if best.get("fits") else None
        parts += ["<h2>Throughput against peak</h2>",
                  _figure(partial(plots.throughput_figure, [(r.label, r.peak, r.speed) for r in runs], chosen,
                                  budget)),
                  "<p class='caption'>One point per configuration that fitted: the mean of its timed runs (its "
                  "probe, and for the chosen one its verification, a longer run), the bars their range. Timings "
                  "on a busy machine vary from run to run.</p>"]
        if chosen is not None:
            parts.append(f"<p>{_e(why(best, runs, chosen))}</p>")
    return parts


def _ledger_table(data: ReportData) -> str:
    assert data.ledger is not None  # shown only where there is a ledger
    rows = "".join(f"<tr><td>{_e(label)}</td><td class='num'>"
                   f"{_e(format_size(sum(data.ledger.get(t, 0.0) for t in terms)))}"
                   f"</td></tr>" for _, label, terms in TERM_GROUPS if sum(data.ledger.get(t, 0.0) for t in terms))
    return _table(f"<tr><th>term</th><th>predicted</th></tr>{rows}")


def _speed(record: dict) -> str:
    """Tokens per second of a probe that fitted; "-" for one that did not (an OOM ran no step to time)."""
    speed = record.get("tokens_per_second") or 0
    return format(speed, ",.0f") if record.get("outcome") == "OK" and speed > 0 else "-"


def _rungs(rungs: List[str]) -> str:
    """Rung names joined by '+', each kept whole: a long list wraps after a '+', never inside a name
    ("micro-" / "batch")."""
    return "+<wbr>".join(f"<span class='nb'>{_e(rung)}</span>" for rung in rungs) or "baseline"


def probes_section(data: ReportData) -> List[str]:
    head = ("<tr><th>#</th><th>kind</th><th>rungs</th><th>configuration</th><th>outcome</th><th>peak</th>"
            "<th>predicted</th><th>tokens/s</th></tr>")
    rows = []
    for index, record in enumerate(data.best.get("candidates", []), 1):
        outcome = record["outcome"]
        rows.append(
            f"<tr><td>{_e(index)}</td><td>{_e(record['kind'])}</td>"
            f"<td>{_rungs(record['rungs'])}</td>"
            f"<td>{_e(record['candidate'])}</td><td class='{_e(outcome)}'>{_e(outcome)}</td>"
            f"<td class='num'>{_e(_size(record.get('peak_bytes')))}</td>"
            f"<td class='num'>{_e(_size(record.get('predicted_bytes')))}</td>"
            f"<td class='num'>{_e(_speed(record))}</td></tr>")
    skipped = data.best.get("skipped") or []
    parts = ["<h2>Every probe of this run</h2>", _table(head + "".join(rows))]
    if skipped:
        parts.append("<p>Not probed (the memory model's low end is over the budget): " + ", ".join(
            f"{_e(s['candidate'])} [{_rungs(s['rungs'])}] "
            f"predicted {_e(_size(s['predicted_bytes']))}"
            for s in skipped) + ".</p>")
    parts.append(f"<p>The study holds {_e(len(data.probes))} probes in all. Browse them with "
                 f"<code>optuna-dashboard {_e(data.out_dir / STUDY_FILE)}</code>.</p>")
    return parts


def render(data: ReportData) -> str:
    body = answer_section(data) + figures_section(data) + probes_section(data)
    versions = ", ".join(f"{name} {version}" for name, version in (data.best.get("versions") or {}).items() if version)
    body.append(f"<p style='color:#777;font-size:0.8rem'>{_e(versions)}</p>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'><title>autofit report: "
            f"{_e(data.best['model'])}</title><style>{STYLE}</style></head><body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def write(out_dir: Path) -> Path:
    """Render ``out_dir/report.html`` from the folder's best.json and study."""
    path = out_dir / REPORT_FILE
    atomic_write_text(path, render(gather(out_dir)))
    return path
