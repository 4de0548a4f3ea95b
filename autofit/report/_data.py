"""What the report shows, gathered from a search's folder: best.json (the answer, its notes and the calibrated
memory model) and the Optuna study beside it (every probe the study holds, earlier runs included). Pure data; no
torch, no plotting."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from autofit.core import Candidate, InputError
from autofit.search import STUDY_FILE

LENGTH_POINTS = 12


@dataclass
class Probe:
    number: int
    level: int
    kind: str
    candidate: Candidate
    outcome: str
    peak_bytes: int
    tokens_per_second: float
    phase_peaks: Dict[str, int]


@dataclass
class ReportData:
    out_dir: Path
    best: Dict[str, Any]
    probes: List[Probe]
    curves: Dict[int, List[Tuple[int, float]]] = field(default_factory=dict)  # level -> (x, predicted bytes)
    ledger: Optional[Dict[str, float]] = None  # the memory model's terms for the chosen configuration
    ledger_phase: Optional[str] = None

    @property
    def axis(self) -> str:
        return "max_length" if self.best.get("search", {}).get("maximize") == "length" else "micro_batch"

    def level_label(self, level: int) -> str:
        rungs = next((p.candidate.rungs for p in self.probes if p.level == level), ())
        return f"{level}: " + ("+".join(rungs) if rungs else "baseline")


def read_best(out_dir: Path) -> Dict[str, Any]:
    path = out_dir / "best.json"
    if not path.is_file():
        raise InputError(f"{path} does not exist: give the --out folder of a search (it holds best.json and "
                         f"{STUDY_FILE})")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} cannot be read ({type(exc).__name__}: {exc}): run the search again") from None
    if not isinstance(data, dict) or "candidates" not in data:
        raise InputError(f"{path} is not a best.json written by autofit search")
    return data


def read_probes(out_dir: Path, study_name: Optional[str]) -> List[Probe]:
    """Every finished probe of the study, in the order they ran."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = out_dir / STUDY_FILE
    if not path.is_file():
        raise InputError(f"{path} does not exist: the report is drawn from the study a search leaves there")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        storage = JournalStorage(JournalFileBackend(str(path)))
        names = [summary.study_name for summary in optuna.get_all_study_summaries(storage)]
        if study_name not in names:
            if not names:
                raise InputError(f"{path} holds no study (empty, or damaged): run the search again to write a report")
            if len(names) > 1:
                raise InputError(f"{path} holds {len(names)} studies and best.json names none of them: run the "
                                 "search again to write a report")
            study_name = names[0]
        trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)
    except InputError:
        raise
    except (ValueError, KeyError, TypeError) as exc:  # a damaged journal (JSONDecodeError is a ValueError)
        raise InputError(f"the study {path} cannot be read ({type(exc).__name__}: {exc}): run the search again "
                         "(it repairs the journal) to write a report") from None
    probes = []
    for trial in trials:
        result, candidate = trial.user_attrs.get("result"), trial.user_attrs.get("candidate")
        if not result or not candidate:
            continue  # interrupted: no result
        probes.append(Probe(
            number=trial.number, level=int(trial.params.get("level", 0)), kind=trial.user_attrs.get("kind", "probe"),
            candidate=Candidate.from_dict(candidate), outcome=result.get("outcome", "?"),
            peak_bytes=int(result.get("peak_bytes") or 0),
            tokens_per_second=float(result.get("tokens_per_second") or 0),
            phase_peaks={k: int(v) for k, v in (result.get("phase_peaks") or {}).items()},
        ))
    return probes


def gather(out_dir: Path) -> ReportData:
    best = read_best(out_dir)
    data = ReportData(out_dir, best, read_probes(out_dir, (best.get("study") or {}).get("name")))
    calibration = _calibration(best)
    if calibration is not None:
        data.curves = _curves(data, calibration)
        chosen = _chosen(data)
        if chosen is not None:
            ledger = _predict(calibration, chosen)
            if ledger is not None:
                from autofit.memory_model import TERMS

                data.ledger = {term: float(getattr(ledger, term)) for term in TERMS}
                data.ledger_phase = ledger.phase
    return data


def _calibration(best: Dict[str, Any]):
    stored = best.get("memory_model")
    if not stored:
        return None
    from autofit.memory_model import Calibration

    try:
        return Calibration.from_dict(stored)
    except (TypeError, ValueError, AttributeError, KeyError):
        return None


def _predict(calibration, candidate: Candidate):
    from autofit.memory_model import predict_calibrated

    try:
        return predict_calibrated(candidate, calibration, calibration.shape)
    except (KeyError, ValueError, ZeroDivisionError, TypeError, AttributeError):
        return None


def _chosen(data: ReportData) -> Optional[Candidate]:
    verified = [record for record in data.best.get("candidates", []) if record.get("kind") == "verify"]
    if not data.best.get("fits") or not verified:
        return None
    described = verified[-1]["candidate"]
    matches = [p.candidate for p in data.probes if p.kind == "verify" and p.candidate.describe() == described]
    return matches[-1] if matches else None


def _curves(data: ReportData, calibration) -> Dict[int, List[Tuple[int, float]]]:
    """The calibrated model along the searched axis, for each level probed (its last probe as the template)."""
    curves = {}
    effective = data.best.get("search", {}).get("effective_batch") or 1
    for level in sorted({p.level for p in data.probes if p.kind == "probe"}):
        template = [p.candidate for p in data.probes if p.kind == "probe" and p.level == level][-1]
        if data.axis == "micro_batch":
            points = [template.replace(micro_batch=mb, grad_accum=effective // mb)
                      for mb in range(1, effective + 1) if effective % mb == 0]
            xs = [candidate.micro_batch for candidate in points]
        else:
            lengths = [p.candidate.max_length for p in data.probes if p.level == level]
            low, high = min(lengths), max(lengths)
            xs = sorted({round(low * (high / low) ** (i / (LENGTH_POINTS - 1))) for i in range(LENGTH_POINTS)}) \
                if high > low else [low]
            points = [template.replace(max_length=x) for x in xs]
        curve = []
        for x, candidate in zip(xs, points, strict=True):
            ledger = _predict(calibration, candidate)
            if ledger is not None and math.isfinite(ledger.total):
                curve.append((x, float(ledger.total)))
        curves[level] = curve
    return curves
