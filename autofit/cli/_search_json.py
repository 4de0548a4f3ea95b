"""``autofit search --json``: the search's answer as one JSON document on stdout, for coding agents and scripts, on
every way the search ends (a fit, nothing fits, bad input, probes that cannot run here, an interruption). It renders
the answer the export derived once (``report.answer``), never a second derivation. Sizes are the estimate's
``{"bytes": int, "gib": float}``; the ``exit`` block is the one ``autofit estimate --json`` carries (``_exit``). The
keys are documented in docs/cli.md ("`autofit search --json`") and stay stable: a new key may be added, none is
renamed or removed without a new ``schema``. While the search runs, everything else written to stdout (a library's
print, a child process's inherited descriptor) goes to stderr (``stdout_to_stderr``), so the document is the only
thing on stdout."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from autofit.cli._estimate_json import size
from autofit.cli._exit import EXIT_PROBES_CANNOT_RUN, exit_block
from autofit.cli._signals import EXIT_INTERRUPTED, EXIT_TERMINATED
from autofit.core import RL_ALGOS, SearchSpec
from autofit.rungs import ACCELERATE_YAML, DEEPSPEED_JSON
from autofit.search import STUDY_FILE

SCHEMA = 1
RESUMABLE = (EXIT_PROBES_CANNOT_RUN, EXIT_INTERRUPTED, EXIT_TERMINATED)  # the same command goes on from the study
FILES = {"best_yaml": "best.yaml", "best_json": "best.json", "report_html": "report.html",
         "accelerate_config": ACCELERATE_YAML, "deepspeed_config": DEEPSPEED_JSON, "study": STUDY_FILE}


def search_json(code: int, message: Optional[str], argv: Sequence[str], out_dir: Path,
                spec: Optional[SearchSpec] = None, report: Any = None, launch: Optional[Sequence[str]] = None) -> str:
    """The document; ``argv``: the command line after ``autofit`` (to resume it), ``launch``: the words after ``--``."""
    answer = getattr(report, "answer", None) if report is not None and report.fits else None
    document: Dict[str, Any] = {
        "schema": SCHEMA,
        "command": "search",
        "exit": exit_block(code, message),
        "fits": bool(report is not None and report.fits),
        "question": _question(spec) if spec is not None else None,
        "answer": _answer(report) if answer is not None else None,
        "nothing_fits": _nothing_fits(report) if report is not None and not report.fits else None,
        "probes": _probes(report) if report is not None else None,
        "files": _files(Path(out_dir)) if spec is not None else None,  # refused before the question: no folder
        "next": _next(code, argv, answer, launch, spec),
        "notes": list(report.notes) if report is not None else [],
    }
    return json.dumps(document, indent=2, default=str, allow_nan=False)


def _files(out_dir: Path) -> Dict[str, Optional[str]]:
    """The out folder and the files in it, absolute (``null``: not written)."""
    folder = out_dir.resolve()
    return {"out_dir": str(folder), **{key: str(folder / name) if (folder / name).is_file() else None
                                       for key, name in FILES.items()}}


def _question(spec: SearchSpec) -> Dict[str, Any]:
    options = spec.options
    rl = options.algo in RL_ALGOS
    return {"algo": options.algo, "model": options.model, "device": spec.device, "config": options.config,
            "budget": size(spec.budget_bytes) if spec.budget_bytes is not None else None, "gpus": spec.ranks,
            "effective_batch": options.effective_batch, "maximize": options.maximize,
            "length_field": "max_completion_length" if rl else "max_length", "length": spec.max_length}


def _answer(report: Any) -> Dict[str, Any]:
    answer, fit, verified = report.answer, report.chosen, report.verified
    return {
        "describe": answer.candidate.describe(),
        "rungs": list(answer.candidate.rungs),
        "cost_class": report.levels[fit.level].cost,
        "trades": list(answer.trades),
        "settings": dict(answer.written),  # what best.yaml writes: the model's keys and the changed training keys
        "comments": dict(answer.comments),  # best.yaml's comment on each: the rung that set it and what it was
        "config": dict(answer.config),  # the config class's keyword arguments (SFTConfig(**config), ...)
        "env": dict(answer.env),
        "peak": size(max(verified.peak_bytes, fit.result.peak_bytes)),
        "predicted_peak": _predicted(report),
        "tokens_per_second": round(verified.tokens_per_second, 1),
        "generation_tokens_per_second": round(verified.generation_tokens_per_second, 1) or None,
        "verified_steps": verified.steps,
        "phase_peaks": verified.phase_peaks,
        "engine": answer.engine,
        "changes": answer.changes,
    }


def _predicted(report: Any) -> Optional[Dict[str, Any]]:
    """The memory model's peak for the chosen configuration, as the search predicted it before its probe."""
    chosen = report.chosen
    for record in report.records:
        if record.candidate == chosen.candidate and record.predicted_bytes is not None:
            return size(record.predicted_bytes)
    return None


def _nothing_fits(report: Any) -> Dict[str, Any]:
    failure = report.lightest_failure()
    skipped = min(report.skipped, key=lambda skip: skip.predicted_bytes) if report.skipped else None
    return {
        "probe_limit_reached": report.probe_limit_reached,
        "stopped": report.stopped,
        "smallest_oom_peak": size(failure.result.peak_bytes) if failure is not None else None,
        "lightest_predicted": (None if skipped is None else {"describe": skipped.candidate.describe(),
                                                            "rungs": list(skipped.candidate.rungs),
                                                            "peak": size(skipped.predicted_bytes)}),
    }


def _probes(report: Any) -> Dict[str, Any]:
    return {"total": report.probes_total, "this_run": report.probes_run,
            "reused": sum(record.cached for record in report.records), "skipped": len(report.skipped)}


def _next(code: int, argv: Sequence[str], answer: Any, launch: Optional[Sequence[str]],
          spec: Optional[SearchSpec]) -> Dict[str, Any]:
    """The commands to run next: ``train`` (the answer's, ``YOUR_...`` words to fill in), ``your_launch`` (the launch
    after ``--`` with best.yaml), ``resume`` (the same command, where running it again goes on)."""
    train = answer.train if answer is not None else None
    own = None
    if answer is not None and launch and answer.engine is None:
        flagged = spec.launch.file.flagged if spec is not None and spec.launch.file is not None else {}
        own = launch_with_best(launch, str(Path(spec.options.out_dir if spec else ".").resolve() / "best.yaml"),
                               flagged)
    resumable = code in RESUMABLE
    return {"train": train, "placeholders": sorted({word for word in shlex.split(train or "")
                                                    if word.startswith("YOUR_")}),
            "your_launch": own, "resume": shlex.join(["autofit", *argv]) if resumable else None}


def launch_with_best(words: Sequence[str], best_yaml: str, flagged: Dict[str, Any]) -> Optional[str]:
    """The user's launch with its ``--config`` replaced by best.yaml and the TRL flags best.yaml has written in taken
    out (left in, a flag would override what fitting changed); accelerate's options stay. None: no ``trl`` in it."""
    words = list(words)
    at = next((i for i, word in enumerate(words) if os.path.basename(word) == "trl"), None)
    if at is None or at + 1 >= len(words):
        return None
    out: List[str] = words[:at + 2]
    rest, i = words[at + 2:], 0
    while i < len(rest):
        word = rest[i]
        name = word.split("=", 1)[0]
        takes_value = "=" not in word and i + 1 < len(rest) and not rest[i + 1].startswith("--")
        if name == "--config":
            out += ["--config", best_yaml]
        elif name.startswith("--") and name[2:] in flagged:
            pass
        else:
            out.append(word)
            if takes_value:
                out.append(rest[i + 1])
        i += 2 if takes_value else 1
    return shlex.join(out)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Inside, stdout is stderr: Python's ``sys.stdout`` and, where it is a real descriptor, descriptor 1 (what child
    processes inherit), so that the JSON document printed after it is the only thing on stdout."""
    sys.stdout.flush()
    saved = None
    try:
        out, err = sys.stdout.fileno(), sys.stderr.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):  # a captured stream (pytest's capsys): Python's level only
        out = err = -1
    if out >= 0 and err >= 0 and out != err:
        sys.stderr.flush()
        saved = os.dup(out)
        os.dup2(err, out)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            sys.stdout.flush()
            os.dup2(saved, out)
            os.close(saved)
