"""report.html as users see it (issue 36, item 4): drawn from a real search's output (tests/data/report-search: the
best.json and study of `autofit search --model tiny-qwen2 --device cpu --gpu-memory 143MiB --max-length 64
--verify-steps 3`, where micro-batch 1x8 fits, 2x4 runs out and checkpointing's 2x4 fits and wins) with this code,
then laid out by headless Chromium at 1280 px and at 420 px (issue 61, item 4): every figure's text inside its figure
and over no other, no number or header wrapped, tables scrolling in their own box, no figure text under 12 px.
Without Chromium the test is skipped, saying so; AUTOFIT_REQUIRE_BROWSER=1 (CI:
.ci/run) makes that a failure. `make report-shot` writes the screenshot to look at."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from autofit import cli

try:
    import report_browser
except ImportError:  # pragma: no cover - run from the repository root
    from tests import report_browser

SEARCHED = Path(__file__).resolve().parents[1] / "data" / "report-search"


def executable() -> str:
    found = report_browser.browser()
    if found is None:
        message = ("no Chromium on PATH (apt-get install chromium, or make browser): report.html was not laid "
                   "out in a browser")
        if os.environ.get("AUTOFIT_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    out = tmp_path_factory.mktemp("report-search")
    for name in ("best.json", "study.journal"):
        shutil.copy(SEARCHED / name, out / name)
    assert cli.main(["report", str(out)]) == 0
    return out, json.loads((out / "best.json").read_text())


@pytest.mark.parametrize("width", report_browser.WIDTHS)
def test_report_at_each_width_has_every_title_whole_and_no_cell_wrapped(drawn, width):
    browser = executable()
    out, _ = drawn
    shot = out / f"report-{width}.png"
    result = report_browser.check(out / "report.html", shot, executable=browser, width=width)
    assert result["width"] == width and result["figures"] == 4  # the wide ones or the narrow ones, not both
    assert result["problems"] == []
    assert result["smallest_text_px"] >= report_browser.MIN_TEXT_PX
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_check_finds_text_over_text_a_table_off_a_phone_and_no_viewport(tmp_path):
    """The check can fail at 420 px: a label drawn over the axis' title, a wide table not in a scrolling box, a page
    without a viewport (the report before issue 61: its probe table ran off the screen, its figures' text at 5 px)."""
    browser = executable()
    from autofit.report import _plots as plots

    figure, axes = plots._figure(width=plots.NARROW)
    axes.plot([1, 2], [1, 2])
    axes.text(0.3, 0.5, "tokens/s", transform=axes.transAxes)
    axes.text(0.32, 0.51, "a point's label", transform=axes.transAxes)  # over it, a little aside
    page = tmp_path / "report.html"
    row = "".join(f"<td class='num'>{n:,} tokens/s</td>" for n in range(1000, 9000, 1000))
    page.write_text(f"<!DOCTYPE html><html><body>{plots.svg(figure)}<table><tr>{row}</tr></table></body></html>")
    result = report_browser.check(page, executable=browser, width=report_browser.NARROW)
    problems = " | ".join(result["problems"])
    assert "is drawn over 'tokens/s'" in problems or "'tokens/s' is drawn over" in problems, problems
    assert "table 1 runs beyond the 420 px window" in problems and "the page declares no viewport" in problems


def test_the_check_finds_a_title_cut_off_and_a_unit_wrapped(tmp_path):
    """The check can fail: the first figure's title of the report before issue 36 (cut off at the SVG's edge),
    a 7-point legend, and a table cell too narrow for its unit."""
    browser = executable()
    from autofit.report import _plots as plots

    figure, axes = plots._figure()
    axes.plot([1, 2], [1, 2], label="a line")
    axes.set_title("Measured peak per ladder level (lines: the memory model calibrated on the level's probes)")
    axes.legend(fontsize=7)
    page = tmp_path / "report.html"
    cell = "<td class='num' style='white-space:normal'>295.24 MiB</td>"  # the report's cells are nowrap now
    page.write_text(f"<!DOCTYPE html><html><body>{plots.svg(figure)}<table style='width:4rem'><tr>{cell}</tr>"
                    "</table></body></html>")
    result = report_browser.check(page, executable=browser)
    assert any("Measured peak per ladder level" in p and "runs out of the figure" in p for p in result["problems"])
    assert any("wraps onto" in p for p in result["problems"])
    assert result["smallest_text_px"] < report_browser.MIN_TEXT_PX


def test_the_chosen_fit_stands_at_its_probe_and_its_verification(drawn):
    """The throughput figure draws each configuration once, with the range of its timed runs, and the page says the
    rule that chose it, with the probe's timing it compared."""
    out, best = drawn
    page = html.unescape((out / "report.html").read_text())
    chosen = [r for r in best["candidates"] if r["kind"] == "verify"][-1]
    probe = next(r for r in best["candidates"] if r["kind"] == "probe" and r["candidate"] == chosen["candidate"])
    assert f"chosen: {chosen['candidate']}" in page and "another fit" in page
    why = re.search(r"<p>(Why this one: [^<]*)</p>", page)
    assert why, "the page says why the winner won"
    text = why.group(1)
    assert "fastest fit by its probe's timing wins" in text and "cheapest cost class with a fit is speed" in text
    assert f"its probe's {probe['tokens_per_second']:,.0f} tokens/s is the timing that was compared" in text
    assert f"Its verification ({chosen['tokens_per_second']:,.0f} tokens/s" in text
