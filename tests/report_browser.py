"""report.html as a user sees it: drawn by headless Chromium at a laptop's width (1280 px), with a script that
measures the laid-out page, and a screenshot to look at.

What is measured, after layout: every text of every figure lies inside its figure (a title cut off at the SVG's
edge is outside it), every figure and table inside the window's width, every number and header of a table on one
line (a unit wrapped onto a line of its own is two; text such as a configuration may wrap between words), and the
smallest font of the figures as drawn (a legend at 7 pt drew 9.3 px letters).

Used by tests/report/test_report_browser.py and by ``make report-shot`` (``python tests/report_browser.py DIR [PNG]``:
checks DIR/report.html and writes the screenshot).
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
HEIGHT = 4000  # px: tall enough for the whole page in one screenshot
SLACK = 1.0  # px: anti-aliasing at a box's edge
MIN_TEXT_PX = 12.0  # the smallest figure text a reader reads without zooming (a legend at 7 pt drew 9.3 px)
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MARK = "autofit-layout"

# Runs in the page after layout; its findings land in an attribute of <body>, which --dump-dom prints.
SCRIPT = """
<script>
(function () {
  const problems = [], W = window.innerWidth, slack = %(slack)s;
  const box = (e) => e.getBoundingClientRect();
  const name = (e) => (e.textContent || "").trim().slice(0, 60);
  let smallest = 1e9;
  document.querySelectorAll("svg").forEach((svg, figure) => {
    const frame = box(svg), view = svg.viewBox.baseVal, scale = view && view.width ? frame.width / view.width : 1;
    if (frame.right > W + slack || frame.left < -slack)
      problems.push(`figure ${figure + 1} is ${Math.round(frame.width)} px wide, beyond the ${W} px window`);
    svg.querySelectorAll("text").forEach((text) => {
      const b = box(text);
      if (!name(text) || b.width === 0) return;
      smallest = Math.min(smallest, parseFloat(getComputedStyle(text).fontSize) * scale);  // as drawn, in px
      if (b.left < frame.left - slack || b.right > frame.right + slack || b.top < frame.top - slack
          || b.bottom > frame.bottom + slack)
        problems.push(`figure ${figure + 1}: the text '${name(text)}' runs out of the figure ` +
                      `(${Math.round(b.left - frame.left)}..${Math.round(b.right - frame.left)} px of ` +
                      `${Math.round(frame.width)})`);
    });
  });
  document.querySelectorAll("table").forEach((table, index) => {
    if (box(table).right > W + slack) problems.push(`table ${index + 1} runs beyond the ${W} px window`);
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
                                                              figures: document.querySelectorAll("svg").length}));
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


def _flags(executable: str) -> List[str]:
    # no sandbox: CI runs as root, where Chromium refuses its sandbox
    return [executable, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--window-size={WIDTH},{HEIGHT}"]


def check(page: Path, screenshot: Optional[Path] = None, executable: Optional[str] = None) -> Dict[str, Any]:
    """Lay ``page`` out in headless Chromium at 1280 px: {"problems": [...], "smallest_text_px": ..., "figures": n};
    with ``screenshot``, the page as drawn, as a PNG."""
    executable = executable or browser()
    if executable is None:
        raise FileNotFoundError("no Chromium on PATH (" + ", ".join(BROWSERS) + ")")
    text = page.read_text()
    with tempfile.TemporaryDirectory() as scratch:
        probe = Path(scratch) / page.name  # a copy with the measuring script; the page itself has no script
        probe.write_text(text.replace("</body>", SCRIPT % {"slack": SLACK, "mark": MARK} + "</body>"))
        dom = _run(_flags(executable) + ["--dump-dom", probe.as_uri()])
        if screenshot is not None:
            _run(_flags(executable) + [f"--screenshot={screenshot}", page.resolve().as_uri()])
    found = re.search(rf'data-{MARK}="([^"]*)"', dom)
    if not found:
        raise RuntimeError(f"the measuring script left no result in {page} (Chromium printed {len(dom)} characters)")
    import html

    return json.loads(html.unescape(found.group(1)))


def main(argv: List[str]) -> int:
    if not argv or len(argv) > 2:
        print("usage: python tests/report_browser.py DIR [SCREENSHOT.png]", file=sys.stderr)
        return 2
    page = Path(argv[0]) / "report.html"
    shot = Path(argv[1]) if len(argv) > 1 else Path(argv[0]) / "report-1280.png"
    if not page.is_file():
        print(f"report-shot: {page} does not exist: give the --out folder of a search", file=sys.stderr)
        return 2
    if browser() is None:
        print("report-shot: no Chromium here (apt-get install chromium): report.html was not checked",
              file=sys.stderr)
        return 0 if os.environ.get("AUTOFIT_REQUIRE_BROWSER") != "1" else 1
    result = check(page, shot)
    for problem in result["problems"]:
        print(f"report-shot: {problem}", file=sys.stderr)
    print(f"report-shot: {page} at {WIDTH} px: {result['figures']} figures, {len(result['problems'])} problem(s), "
          f"smallest figure text {result['smallest_text_px']:.1f} px; screenshot {shot}")
    return 1 if result["problems"] or result["smallest_text_px"] < MIN_TEXT_PX else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
