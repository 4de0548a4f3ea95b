"""The figures of the report and of ``autofit estimate --plot``: matplotlib, drawn without pyplot (no global state,
no display), as SVG whose text stays text (searchable in the page, readable by tests)."""

from __future__ import annotations

import io
from typing import Dict, List, Optional, Sequence, Tuple

from autofit.memory_model import TERM_GROUPS

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974",
          "#64b5cd"]


LEGEND_SIZE = 9  # points: 12 px in the page (7 drew 9 px letters, too small to read)
WIDE, NARROW = 7.5, 4.0  # inches: a laptop's figure (720 px), and a phone's (384 px: 420 px less the page's margins)
NARROW_TITLE = 28  # characters of a narrow figure's title line (12 pt; centred over axes that tick labels push right)
CURVE_REACH = 3.0  # the peak axis shows the model's curves up to this many budgets; above, they end at the top, marked
OOM_DODGE = 2**0.06  # the factor between two levels' OOM crosses on the x axis (a log axis: the same gap everywhere)


def plain(text: str) -> str:
    """A label as written: matplotlib reads text between two '$' as TeX math (and fails on what does not parse).
    Labels come from best.json and the study; the SVG writer escapes '<' and '&' itself."""
    return str(text).replace("$", r"\$")


def unit_for(budget: Optional[float]) -> Tuple[str, float]:
    return ("GiB", 2**30) if budget and budget >= 2 * 2**30 else ("MiB", 2**20)


def _figure(width: float = WIDE, height: float = 4.0):
    import matplotlib

    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text
    matplotlib.rcParams["svg.hashsalt"] = "autofit"  # stable element ids: the same study renders the same file
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.add_subplot()


def svg(figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # inline in HTML: no XML prolog, no doctype


def _title(axes, title: str, width: float, **style) -> None:
    """The axes' title, wrapped onto lines a narrow figure holds."""
    import textwrap

    axes.set_title(textwrap.fill(title, NARROW_TITLE) if width < WIDE else title, **style)


def _legend(figure, width: float, entries: int, wide_columns: int, narrow_columns: int = 1, items=()) -> None:
    """The figure's legend below its axes, in fewer columns on a narrow figure, where entries side by side run out
    of it."""
    columns = wide_columns if width >= WIDE else narrow_columns
    figure.legend(*items, fontsize=LEGEND_SIZE, loc="outside lower center", frameon=False,
                  ncol=min(columns, max(entries, 1)))


def _budget_lines(axes, budget: Optional[float], margin: float, scale: float, unit: str, vertical: bool = False):
    if not budget:
        return
    line = axes.axvline if vertical else axes.axhline
    line(budget / scale, color="black", linewidth=1.2, label=f"budget {budget / scale:,.2f} {unit}")
    if margin > 0:
        line(budget * (1 - margin) / scale, color="black", linestyle="--", linewidth=1,
             label=f"budget minus the margin ({margin:.1%})")


def peaks_figure(series: Sequence[Dict], axis_name: str, budget: Optional[float], margin: float,
                 width: float = WIDE):
    """Measured peak against micro-batch (or length), one colour per ladder level, with the model's curve
    calibrated on the level's own probes. ``series``: {"label", "points": [(x, peak, outcome)],
    "curve": [(x, predicted)]}."""
    unit, scale = unit_for(budget)
    figure, axes = _figure(width, 4.0 if width >= WIDE else 3.2 + 0.2 * len(series))
    for index, level in enumerate(series):
        color = COLORS[index % len(COLORS)]
        if level["curve"]:
            curve_xs, curve_ys = zip(*sorted(level["curve"]), strict=True)
            axes.plot(curve_xs, [y / scale for y in curve_ys], color=color, linewidth=1, alpha=0.6)
        # an OOM's peak is where it stopped, near the budget for every level: each level's crosses a little aside
        dodge = OOM_DODGE ** (index - (len(series) - 1) / 2)
        for marker, outcome, shift in (("o", "OK", 1.0), ("x", "OOM", dodge)):
            points = [(x, peak) for x, peak, kind in level["points"] if kind == outcome]
            if points:
                axes.scatter([x * shift for x, _ in points], [peak / scale for _, peak in points], marker=marker,
                             color=color, label=plain(f"{level['label']} ({outcome})"), zorder=3)
    _budget_lines(axes, budget, margin, scale, unit)
    _peak_axis_top(axes, series, budget, scale, unit)
    xs = sorted({x for level in series for x, *_ in list(level["points"]) + list(level["curve"])})
    # divisors of the batch: a log axis, each labelled
    if len(xs) > 1 and all(b >= 1.5 * a for a, b in zip(xs, xs[1:], strict=False)):
        from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_locator(FixedLocator(xs))
        axes.xaxis.set_minor_locator(NullLocator())
        axes.xaxis.set_major_formatter(ScalarFormatter())
    axes.set_xlabel(axis_name)
    axes.set_ylabel(f"peak ({unit})")
    _title(axes, "Measured peak per ladder level", width)
    _legend(figure, width, len(axes.get_legend_handles_labels()[0]), 3)
    return figure


def _peak_axis_top(axes, series: Sequence[Dict], budget: Optional[float], scale: float, unit: str) -> None:
    """The top of the peak axis: every measurement and the model's curves, up to ``CURVE_REACH`` budgets (they run
    far past the budget at large batches); a curve cut there ends at the top with its value written."""
    measured = [peak for level in series for _, peak, _ in level["points"]]
    if not budget or not measured:
        return
    curves = [y for level in series for _, y in level["curve"]]
    top = max(1.5 * budget, 1.1 * max(measured), min(1.05 * max(curves, default=0.0), CURVE_REACH * budget))
    axes.set_ylim(top=top / scale)
    stacked: Dict[float, int] = {}  # levels whose curves leave at the same x: their values one under another
    for index, level in enumerate(series):
        over = sorted((x, y) for x, y in level["curve"] if y > top)
        if over:
            x, y = over[0]
            below = stacked[x] = stacked.get(x, -1) + 1
            axes.annotate(f"{y / scale:,.0f} {unit}", (x, top / scale), xytext=(0, -4 - 1.3 * LEGEND_SIZE * below),
                          textcoords="offset points", ha="right", va="top", fontsize=LEGEND_SIZE,
                          color=COLORS[index % len(COLORS)])


# The order a step goes through the phases a probe records (autofit.probe._instrument); GRPO and RLOO generate and
# score before their forward and backward. Others follow in the order recorded.
PHASE_ORDER = ("setup", "load", "train_setup", "generation", "scoring", "forward_backward", "optimizer_step",
               "between_steps")


def phases_figure(phase_peaks: Dict[str, float], budget: Optional[float], margin: float, width: float = WIDE):
    unit, scale = unit_for(budget)
    figure, axes = _figure(width, max(2.0, 0.35 * len(phase_peaks) + 1.2) + (0.0 if width >= WIDE else 0.8))
    recorded = list(phase_peaks)
    names = sorted(recorded, key=lambda name: (PHASE_ORDER.index(name) if name in PHASE_ORDER else len(PHASE_ORDER),
                                               recorded.index(name)))
    axes.barh([plain(name) for name in names], [phase_peaks[name] / scale for name in names], color=COLORS[0])
    axes.invert_yaxis()  # in the order the step goes through them
    _budget_lines(axes, budget, margin, scale, unit, vertical=True)
    axes.set_xlabel(f"peak ({unit})")
    _title(axes, "The chosen configuration's peak by phase", width)
    if width >= WIDE:
        axes.legend(fontsize=LEGEND_SIZE, loc="lower right")
    else:  # the narrow axes have no room beside the bars
        _legend(figure, width, 2, 1)  # the budget and its margin
    return figure


def ledger_figure(rows: Sequence[Tuple[str, Dict[str, float]]], budget: Optional[float], title: str,
                  width: float = 9.5):
    """Stacked bars of the memory model's terms: one bar per row (a ladder level, or the chosen configuration)."""
    unit, scale = unit_for(budget)
    figure, axes = _figure(width, max(2.4, 0.4 * len(rows) + 1.8) + (0.0 if width >= WIDE else 1.6))
    labels = [plain(label) for label, _ in rows]
    left = [0.0] * len(rows)
    for index, (_, name, terms) in enumerate(TERM_GROUPS):
        widths = [sum(ledger.get(term, 0.0) for term in terms) / scale for _, ledger in rows]
        if any(widths):
            axes.barh(labels, widths, left=left, color=COLORS[index], label=name)
            left = [a + b for a, b in zip(left, widths, strict=True)]
    axes.invert_yaxis()
    _budget_lines(axes, budget, 0.0, scale, unit, vertical=True)
    axes.set_xlabel(f"predicted peak ({unit})")
    _title(axes, title, width, fontsize=10)
    _legend(figure, width, 4, 4, narrow_columns=2)  # the terms' names are short: two a row
    return figure


def throughput_figure(runs: Sequence[Tuple[str, float, float]], chosen: Optional[str], budget: Optional[float],
                      width: float = WIDE):
    """tokens/s against peak, one point per configuration that fitted: the mean of its timed runs (its probe, and
    for the chosen one its verification), the bars their range. ``runs``: (label, peak, tokens/s). Each point is
    labelled on the side of the axes it has room on; a narrow figure leaves the labels to its legend and the probe
    table (a configuration's words are wider than its axes)."""
    unit, scale = unit_for(budget)
    figure, axes = _figure(width, 4.0 if width >= WIDE else 4.6)
    placed = []
    by_label: Dict[str, List[Tuple[float, float]]] = {}
    for label, peak, speed in runs:
        by_label.setdefault(label, []).append((peak / scale, speed))
    for label, points in by_label.items():
        peaks, speeds = [p for p, _ in points], [s for _, s in points]
        x, y = sum(peaks) / len(peaks), sum(speeds) / len(speeds)
        mine = label == chosen
        color = COLORS[3] if mine else COLORS[0]
        axes.errorbar([x], [y], xerr=[[x - min(peaks)], [max(peaks) - x]], yerr=[[y - min(speeds)], [max(speeds) - y]],
                      fmt="*" if mine else "o", markersize=14 if mine else 7, color=color, capsize=4, zorder=3,
                      label=plain(f"chosen: {label}" if mine else "another fit"))
        placed.append((label, x, y, color))
    _budget_lines(axes, budget, 0.0, scale, unit, vertical=True)
    axes.margins(x=0.25, y=0.25)  # room for each point's label beside it
    if width >= WIDE:
        low, high = axes.get_xlim()
        for label, x, y, color in placed:  # the label on the side with room: left of a point in the right half
            right = x > (low + high) / 2  # (the budget line, at the right, was the rule: a label ran over the ticks)
            axes.annotate(plain(label), (x, y), xytext=(-8 if right else 8, 6), textcoords="offset points",
                          ha="right" if right else "left", fontsize=LEGEND_SIZE, color=color)
    axes.set_xlabel(f"peak ({unit})")
    axes.set_ylabel("tokens/s")
    _title(axes, "Tokens/s against peak, each configuration that fitted", width)
    handles, labels = axes.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # one entry for every other fit
    _legend(figure, width, len(unique), len(unique), items=(unique.values(), unique.keys()))
    return figure


def save(figure, path) -> None:
    figure.savefig(path, bbox_inches="tight",
                   metadata=None if str(path).lower().endswith((".png", ".pdf")) else {"Date": None})


PLOT_SUFFIXES: List[str] = [".svg", ".png", ".pdf"]
