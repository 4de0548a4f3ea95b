"""The answer's files in the out folder: best.json, best.yaml, the engine's files beside them, and the checkpoint
best.yaml names for a bundled model (built last, so that a cache that cannot take it leaves the answer written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

from autofit.core import atomic_write_text
from autofit.export._answer import answer
from autofit.export._engine import exported_engine
from autofit.export._json import json_data
from autofit.export._write import build_trainable, yaml_text
from autofit.rungs import remove_stale_engine_files, write_engine_files
from autofit.search import SearchReport


def write(report: SearchReport, out_dir: Path) -> Dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "best.json", "yaml": out_dir / "best.yaml"}
    answered = report.answer = answer(report, out_dir)  # derived once: best.json, best.yaml and the terminal render it
    atomic_write_text(paths["json"], json.dumps(json_data(report, out_dir, answered), indent=2, default=str) + "\n")
    engine = exported_engine(report) if report.fits else None
    if engine:
        assert report.chosen is not None  # an engine is exported for a fit only
        chosen = report.chosen.candidate
        paths.update(write_engine_files(out_dir, engine, chosen.device, chosen.ranks, report.spec.options.nodes))
    else:
        remove_stale_engine_files(out_dir)
    if answered is not None:
        atomic_write_text(paths["yaml"], yaml_text(answered))
        build_trainable(report, out_dir)
    else:
        paths["yaml"].unlink(missing_ok=True)  # a stale answer from an earlier search would mislead
    return paths
