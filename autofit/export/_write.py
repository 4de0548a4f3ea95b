"""best.yaml (for ``trl <algo> --config``): the answer's keys as TRL's arguments, each with its comment, or the user's
own file with the changes (``autofit.export._answer``); and the checkpoint it names for a bundled model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from autofit.core import one_line
from autofit.export._answer import Answer
from autofit.machine import resolve_model
from autofit.probe.kit import trainable_checkpoint
from autofit.search import InfrastructureError, SearchReport


def build_trainable(report: SearchReport, out_dir: Path) -> None:
    """The random-weight checkpoint best.yaml names for a bundled toy model, written after the answer: a cache that
    cannot take it (a full disk) is one line, and the same command, which probes nothing again, finishes it."""
    assert report.chosen is not None
    source = resolve_model(report.chosen.candidate.model)
    if source.local_path or "/" in report.chosen.candidate.model:
        return
    try:
        trainable_checkpoint(source.config, report.chosen.candidate.model)
    except (RuntimeError, OSError) as exc:
        raise InfrastructureError(
            f"{out_dir / 'best.json'} and best.yaml are written, but the trainable checkpoint they name could not "
            f"be: {one_line(exc)}; free space in the cache and run the same command again to finish it (it resumes "
            f"from {out_dir})") from None


def _scalar(value: Any) -> str:
    """One YAML line: strings double-quoted, in UTF-8; escaped (JSON's, YAML's \\U) only what cannot stand as it is."""
    if isinstance(value, str):  # an emoji as it is: JSON's \ud83d\ude80 load in YAML as two lone surrogates
        return "".join(c if c.isprintable() else f"\\U{ord(c):08x}" for c in json.dumps(value, ensure_ascii=False))
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip().removesuffix("...").strip()


def yaml_text(answer: Answer) -> str:
    """best.yaml: the user's own file with the changes (``--config``), else the header and the answer's keys that
    differ from the config class's defaults, each with its comment, and the env block."""
    if answer.user_text is not None:
        return answer.user_text
    lines = list(answer.header)
    for key, value in answer.written.items():
        lines.append(f"{key}: {_scalar(value)}  # {answer.comments[key]}")
    if answer.env:
        lines.append("env:")
        for key, value in answer.env:
            lines.append(f"  {key}: {_scalar(value)}  # {answer.comments[f'env.{key}']}")
    return "\n".join(lines) + "\n"
