"""report.html as a user sees it: drawn by headless Chromium at a laptop's width (1280 px) and a phone's (420 px),
with a script that measures the laid-out page, and a screenshot of each to look at.

What is measured, after layout, in the figures the window shows (the page draws each twice, a wide one and a narrow
one, and its style shows one): every text of every figure lies inside its figure (a title cut off at the SVG's edge
is outside it) and over no other text of it (a point's label over the axis' title), every figure inside the window's
width, every table inside the window or in a box of its own that scrolls sideways (the page itself never does),
every number and header of a table on one line (a unit wrapped onto a line of its own is two; text such as a
configuration may wrap between words), a viewport declared (without it a phone lays the page out at 980 px and
shrinks it), and the smallest font of the figures as drawn (a legend at 7 pt drew 9.3 px letters).

Used by tests/report/test_report_browser.py and by ``make report-shot`` (``python tests/report_browser.py DIR
[PREFIX]``: checks DIR/report.html at both widths and writes PREFIX-420.png and PREFIX-1280.png, by default
DIR/report-*.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

WIDTH = 1280  # px: a laptop's window
NARROW = 420  # px: a phone held upright, or a pane beside an editor
WIDTHS = (NARROW, WIDTH)
OVERLAP = 2.0  # px each way: two texts' boxes crossing by more are drawn over each other
SMALLEST_WINDOW = 500  # px: headless Chromium's narrowest window; a narrower page is laid out in a frame that wide
# The page in a frame ``width`` px wide (its own viewport, its style's media queries), at the window's left; the
# frame's findings copied to the window's <body>, which --dump-dom prints (the frame's own DOM it does not).
FRAME = """<!DOCTYPE html><html><body style="margin:0"><iframe id="page" style="width:%(width)spx;height:%(height)spx;
border:0" srcdoc="%(page)s"></iframe><script>
document.getElementById("page").addEventListener("load", (event) => {
  const found = event.target.contentDocument.body.getAttribute("data-%(mark)s");
  if (found) document.body.setAttribute("data-%(mark)s", found);
});
</script></body></html>
"""
HEIGHT = 4000  # px: tall enough for the whole page in one screenshot
SLACK = 1.0  # px: anti-aliasing at a box's edge
MIN_TEXT_PX = 12.0  # the smallest figure text a reader reads without zooming (a legend at 7 pt drew 9.3 px)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MARK = "autofit-layout"

# Runs in the page after layout; its findings land in an attribute of <body>, which --dump-dom prints.
SCRIPT = """
<script>
(function () {
  const problems = [], W = window.innerWidth, slack = %(slack)s, overlap = %(overlap)s;
  const box = (e) => e.getBoundingClientRect();
  const name = (e) => (e.textContent || "").trim().slice(0, 60);
  let smallest = 1e9, shown = 0;
  if (!document.querySelector("meta[name=viewport]")) problems.push("the page declares no viewport");
  Array.from(document.querySelectorAll("svg")).filter((svg) => box(svg).width > 0).forEach((svg, figure) => {
    shown += 1;
    const frame = box(svg), view = svg.viewBox.baseVal, scale = view && view.width ? frame.width / view.width : 1;
    if (frame.right > W + slack || frame.left < -slack)
      problems.push(`figure ${figure + 1} is ${Math.round(frame.width)} px wide, beyond the ${W} px window`);
    const texts = [];
    svg.querySelectorAll("text").forEach((text) => {
      const b = box(text);
      if (!name(text) || b.width === 0) return;
      texts.push([text, b]);
      smallest = Math.min(smallest, parseFloat(getComputedStyle(text).fontSize) * scale);  // as drawn, in px
      if (b.left < frame.left - slack || b.right > frame.right + slack || b.top < frame.top - slack
          || b.bottom > frame.bottom + slack)
        problems.push(`figure ${figure + 1}: the text '${name(text)}' runs out of the figure ` +
                      `(${Math.round(b.left - frame.left)}..${Math.round(b.right - frame.left)} px of ` +
                      `${Math.round(frame.width)})`);
    });
    texts.forEach(([text, a], i) => texts.slice(i + 1).forEach(([other, b]) => {
      const across = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      const down = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (across > overlap && down > overlap)
        problems.push(`figure ${figure + 1}: the text '${name(text)}' is drawn over '${name(other)}'`);
    }));
  });
  document.querySelectorAll("table").forEach((table, index) => {
    const scroller = table.closest(".scroll");
    const scrolls = scroller && ["auto", "scroll"].includes(getComputedStyle(scroller).overflowX);
    if ((scrolls ? box(scroller) : box(table)).right > W + slack)
      problems.push(`table ${index + 1} runs beyond the ${W} px window`);
    table.querySelectorAll("td.num, th").forEach((cell) => {  // a number and its unit, a header: one line
      const range = document.createRange();
      range.selectNodeContents(cell);
      const lines = new Set(Array.from(range.getClientRects()).filter((r) => r.width > 0)
                                 .map((r) => Math.round(r.top)));
      if (lines.size > 1) problems.push(`table ${index + 1}: the cell '${name(cell)}' wraps onto ${lines.size} lines`);
    });
  });
  if (document.documentElement.scrollWidth > W + slack)
    problems.push(`the page is ${document.documentElement.scrollWidth} px wide, beyond the ${W} px window`);
  document.body.setAttribute("data-%(mark)s", JSON.stringify({problems: problems, smallest_text_px: smallest,
                                                              figures: shown, width: W}));
})();
</script>
"""


def browser() -> Optional[str]:
    """The Chromium (or Chrome) on PATH, or None."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _run(command: List[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def _flags(executable: str, width: int) -> List[str]:
    # no sandbox: CI runs as root, where Chromium refuses its sandbox
    return [executable, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--window-size={width},{HEIGHT}"]


def check(page: Path, screenshot: Optional[Path] = None, executable: Optional[str] = None,
          width: int = WIDTH) -> Dict[str, Any]:
    """Lay ``page`` out in headless Chromium ``width`` px wide: {"problems": [...], "smallest_text_px": ...,
    "figures": the figures shown, "width": the window's}; with ``screenshot``, the page as drawn, as a PNG."""
    executable = executable or browser()
    if executable is None:
        raise FileNotFoundError("no Chromium on PATH (" + ", ".join(BROWSERS) + ")")
    text = page.read_text()
    measured = text.replace("</body>", SCRIPT % {"slack": SLACK, "mark": MARK, "overlap": OVERLAP} + "</body>")
    window = max(width, SMALLEST_WINDOW)
    with tempfile.TemporaryDirectory() as scratch:
        probe, shown = Path(scratch) / page.name, Path(scratch) / f"shown-{page.name}"
        probe.write_text(_framed(measured, width))  # a copy with the measuring script; the page itself has none
        shown.write_text(_framed(text, width))
        dom = _run(_flags(executable, window) + ["--dump-dom", probe.as_uri()])
        if screenshot is not None:
            _run(_flags(executable, window) + [f"--screenshot={screenshot}",
                                               (shown if width < window else page.resolve()).as_uri()])
    found = re.search(rf'data-{MARK}="([^"]*)"', dom)
    if not found:
        raise RuntimeError(f"the measuring script left no result in {page} (Chromium printed {len(dom)} characters)")
    import html

    return json.loads(html.unescape(found.group(1)))


def _framed(text: str, width: int) -> str:
    """The page as Chromium lays it out ``width`` px wide: itself, or, narrower than a window can be, in a frame."""
    import html

    if width >= SMALLEST_WINDOW:
        return text
    return FRAME % {"width": width, "height": HEIGHT, "page": html.escape(text, quote=True), "mark": MARK}


def main(argv: List[str]) -> int:
    if not argv or len(argv) > 2:
        print("usage: python tests/report_browser.py DIR [SCREENSHOT_PREFIX]", file=sys.stderr)
        return 2
    page = Path(argv[0]) / "report.html"
    prefix = argv[1] if len(argv) > 1 else str(Path(argv[0]) / "report")
    if not page.is_file():
        print(f"report-shot: {page} does not exist: give the --out folder of a search", file=sys.stderr)
        return 2
    if browser() is None:
        print("report-shot: no Chromium here (apt-get install chromium): report.html was not checked",
              file=sys.stderr)
        return 0 if os.environ.get("AUTOFIT_REQUIRE_BROWSER") != "1" else 1
    failed = False
    for width in WIDTHS:
        shot = Path(f"{prefix}-{width}.png")
        result = check(page, shot, width=width)
        for problem in result["problems"]:
            print(f"report-shot: at {width} px: {problem}", file=sys.stderr)
        print(f"report-shot: {page} at {width} px: {result['figures']} figures, {len(result['problems'])} "
              f"problem(s), smallest figure text {result['smallest_text_px']:.1f} px; screenshot {shot}")
        failed = failed or bool(result["problems"]) or result["smallest_text_px"] < MIN_TEXT_PX
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
