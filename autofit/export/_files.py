"""The answer's outputs: each a rendering of the one answer (``autofit.export._answer``) with its name, the files of
the out folder (best.json, best.yaml) and the terminal's summary; beside them the engine's files, and the checkpoint
best.yaml names for a bundled model (built last, so that a cache that cannot take it leaves the answer written).
report.html is drawn from best.json (``autofit.report``). A new output is one more ``Output`` here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

from autofit.export._answer import Answer, answer
from autofit.export._engine import exported_engine
from autofit.export._json import json_data
from autofit.export._table import summary_lines
from autofit.export._write import build_trainable, yaml_text
from autofit.machine import atomic_write_text
from autofit.rungs import remove_stale_engine_files, write_engine_files
from autofit.search import SearchReport


@dataclass(frozen=True)
class Output:
    name: str  # the file in the out folder; "" for the terminal
    # the text; None where there is nothing to write (no fit: an earlier search's file is removed, it would mislead)
    render: Callable[[SearchReport, Optional[Answer]], Optional[str]]


def _json(report: SearchReport, answered: Optional[Answer]) -> str:
    return json.dumps(json_data(report, answer=answered), indent=2, default=str) + "\n"


def _yaml(report: SearchReport, answered: Optional[Answer]) -> Optional[str]:
    return yaml_text(answered) if answered is not None else None


def _terminal(report: SearchReport, answered: Optional[Answer]) -> Optional[str]:
    return "\n".join(summary_lines(report, answered)) if answered is not None else None


FILES = (Output("best.json", _json), Output("best.yaml", _yaml))
TERMINAL = Output("", _terminal)
OUTPUTS = FILES + (TERMINAL,)


def write(report: SearchReport, out_dir: Path) -> Dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    answered = report.answer = answer(report, out_dir)  # derived once: every output renders it
    paths = {}
    for output in FILES:
        path, text = out_dir / output.name, output.render(report, answered)
        paths[path.suffix.lstrip(".")] = path
        if text is None:
            path.unlink(missing_ok=True)
        else:
            atomic_write_text(path, text)
    engine = exported_engine(report) if report.fits else None
    if engine:
        assert report.chosen is not None  # an engine is exported for a fit only
        chosen = report.chosen.candidate
        paths.update(write_engine_files(out_dir, engine, chosen.device, chosen.ranks, report.spec.options.nodes))
    else:
        remove_stale_engine_files(out_dir)
    if answered is not None:
        build_trainable(report, out_dir)
    return paths
