"""docs/layout.md lists every module of autofit by its path (issue 45, item 6): a new module is described where a new
engineer looks first, and a module that is gone leaves no stale line."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "autofit"


def test_the_layout_page_names_every_module_and_no_missing_one():
    page = (REPO / "docs" / "layout.md").read_text()
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    # a module is named by its path inside its package (``core/_knobs.py``), or inside its folder (``liger/_rung.py``)
    # a package's facade (``core/__init__.py``) by its folder's heading (``autofit/core/``)
    missing = [m for m in sorted(modules) if m not in page and "/".join(m.split("/")[-2:]) not in page
               and not (m.endswith("/__init__.py") and f"autofit/{m.rsplit('/', 1)[0]}/" in page)]
    assert not missing, missing
    named = set(re.findall(r"`((?:[a-z_]+/)+_?[a-z_]+\.py)`", page))
    stale = [n for n in sorted(named) if not any(m.endswith(n) for m in modules) and not (REPO / n).exists()]
    assert not stale, stale
