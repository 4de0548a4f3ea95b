"""What the report shows, gathered from a search's folder: best.json (the answer, its notes and the calibrated
memory model) and the Optuna study beside it (every probe the study holds, earlier runs included). Pure data; no
torch, no plotting."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from autofit.core import Candidate, InputError, one_line
from autofit.search import STUDY_FILE, quiet_optuna

log = logging.getLogger(__name__)

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
        return "max_length" if (self.best.get("search") or {}).get("maximize") == "length" else "micro_batch"

    def level_label(self, level: int) -> str:
        rungs = next((p.candidate.rungs for p in self.probes if p.level == level), ())
        return "+".join(rungs) if rungs else "baseline"  # the rungs, not the ladder's internal level number


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
    check_best(data, path)
    return data


# best.json as the report reads it: every field it draws, of the type a search writes. Anything else is refused
# (exit 2, naming the field) before a page is drawn; what passes is still escaped where it is drawn.
MAX_BYTES = 2**64  # far beyond any device: a count of bytes above it is not a measurement
MAX_EFFECTIVE_BATCH = 2**20  # the report's curves visit every divisor of the effective batch
MAX_PHASES = 64  # one bar each in the phase figure


def _integer(value: Any, low: int = 0, high: int = MAX_BYTES) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 <= value <= MAX_BYTES)


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _peaks(value: Any) -> bool:
    return (isinstance(value, dict) and len(value) <= MAX_PHASES
            and all(isinstance(name, str) and _number(peak) for name, peak in value.items()))


TEXT, TEXTS = (lambda v: isinstance(v, str), "a string"), (_texts, "a list of strings")
BYTES, NUMBER = (_integer, "a whole number of bytes"), (_number, "a finite number, not negative")
OBJECT, LIST = (lambda v: isinstance(v, dict), "an object"), (lambda v: isinstance(v, list), "a list")
ALWAYS, FITS, MAY = "always", "fits", "may"  # a field is always written, written when it fits, or may be null
# field: (check, what is expected, when it must be there); dotted names are fields of the object named before
BEST_FIELDS: Dict[str, Tuple[Any, str, str]] = {
    "fits": (lambda v: isinstance(v, bool), "true or false", ALWAYS),
    "model": (*TEXT, ALWAYS), "algo": (*TEXT, ALWAYS), "device": (*TEXT, ALWAYS), "gpu": (*TEXT, MAY),
    "candidates": (*LIST, ALWAYS), "skipped": (*LIST, MAY),
    "budget_bytes": (*BYTES, MAY), "smallest_oom_peak_bytes": (*BYTES, MAY),
    "margin": (lambda v: _number(v) and v < 1, "a fraction of the budget, from 0 to 1", MAY),
    "tokens_per_second": (*NUMBER, FITS), "rungs": (*TEXTS, FITS), "trades": (*TEXTS, MAY), "notes": (*TEXTS, MAY),
    "versions": (lambda v: isinstance(v, dict) and all(x is None or isinstance(x, str) for x in v.values()),
                 "an object of versions (strings or null)", MAY),
    "memory_model": (*OBJECT, MAY), "search": (*OBJECT, MAY), "study": (*OBJECT, MAY), "verified": (*OBJECT, FITS),
    "search.maximize": (*TEXT, MAY),
    "search.effective_batch": (lambda v: _integer(v, 1, MAX_EFFECTIVE_BATCH),
                               f"a whole number from 1 to {MAX_EFFECTIVE_BATCH}", MAY),
    "study.name": (*TEXT, MAY),
    "verified.steps": (lambda v: _integer(v, 1), "a whole number of steps, at least 1", FITS),
    "verified.peak_bytes": (*BYTES, FITS),
    "verified.phase_peaks": (_peaks, f"an object of at most {MAX_PHASES} phases and their peaks in bytes", MAY),
}
RECORD_FIELDS: Dict[str, Dict[str, Tuple[Any, str, str]]] = {  # each item of these lists
    "candidates": {"kind": (*TEXT, ALWAYS), "rungs": (*TEXTS, ALWAYS), "candidate": (*TEXT, ALWAYS),
                   "outcome": (*TEXT, ALWAYS), "peak_bytes": (*BYTES, ALWAYS), "predicted_bytes": (*NUMBER, MAY),
                   "tokens_per_second": (*NUMBER, ALWAYS)},
    "skipped": {"rungs": (*TEXTS, ALWAYS), "candidate": (*TEXT, ALWAYS), "predicted_bytes": (*NUMBER, ALWAYS)},
}


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_fields(data: Dict[str, Any], fields: Dict[str, Tuple[Any, str, str]], path: Path, prefix: str,
                  fits: bool = False) -> None:
    for name, (check, expected, when) in fields.items():
        parent: Any = data
        *outer, key = name.split(".")
        for part in outer:
            parent = parent.get(part) or {}  # checked to be an object (or absent) before its fields
        if parent.get(key) is None:
            if when == ALWAYS or (when == FITS and fits):
                raise InputError(f"{path}: the field '{prefix}{name}' is {'null' if key in parent else 'missing'}"
                                 f"{' although fits is true' if when == FITS else ''}: not what autofit search "
                                 "writes (run the search again)")
            continue
        if not check(parent[key]):
            raise InputError(f"{path}: the field '{prefix}{name}' is {_shown(parent[key])}, not what autofit "
                             f"search writes ({expected}): run the search again")


def check_best(data: Dict[str, Any], path: Path) -> None:
    """Refuse a best.json (``path``) whose fields the report draws are not what a search writes: an InputError
    naming the file and the field."""
    _check_fields(data, {"fits": BEST_FIELDS["fits"]}, path, "")
    _check_fields(data, BEST_FIELDS, path, "", fits=data["fits"])
    for list_name, fields in RECORD_FIELDS.items():
        for index, record in enumerate(data.get(list_name) or []):
            if not isinstance(record, dict):
                raise InputError(f"{path}: the field '{list_name}[{index}]' is {_shown(record)}, not what autofit "
                                 "search writes (an object): run the search again")
            _check_fields(record, fields, path, f"{list_name}[{index}].")
    if data["fits"] and not any(record["kind"] == "verify" for record in data["candidates"]):
        raise InputError(f"{path}: the field 'candidates' holds no verification run although fits is true: not "
                         "what autofit search writes (run the search again)")


def read_probes(out_dir: Path, study_name: Optional[str], fingerprint: Optional[str] = None) -> List[Probe]:
    """Every finished probe of the study, in the order they ran, that was measured on ``fingerprint`` where one is
    given (the search's: a probe of the model's earlier configuration, or on other libraries, is another question's;
    best.json's notes say how many the search measured again). A record the report cannot read is left out, with a
    warning, as the search leaves it out of its reuse."""
    path = out_dir / STUDY_FILE
    if not path.is_file():
        raise InputError(f"{path} does not exist: the report is drawn from the study a search leaves there")
    try:
        with quiet_optuna():  # the caller's verbosity is left as found (fit() draws the report after its search)
            trials = _trials(path, study_name)
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
        if fingerprint and trial.user_attrs.get("fingerprint") != fingerprint:
            continue
        try:
            probe = Probe(
                number=trial.number, level=int(trial.params.get("level", 0)),
                kind=str(trial.user_attrs.get("kind", "probe")), candidate=Candidate.from_dict(candidate),
                outcome=str(result.get("outcome", "?")), peak_bytes=int(result.get("peak_bytes") or 0),
                tokens_per_second=float(result.get("tokens_per_second") or 0),
                phase_peaks={str(k): int(v) for k, v in (result.get("phase_peaks") or {}).items()},
            )
            sizes = (probe.candidate.micro_batch, probe.candidate.grad_accum, probe.candidate.max_length)
            if not all(_integer(size, 1) for size in sizes) or not _number(probe.tokens_per_second) \
                    or not _integer(probe.peak_bytes):
                raise ValueError(f"sizes {sizes}, peak {probe.peak_bytes}, {probe.tokens_per_second} tokens/s")
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
            log.warning("study record %d of %s is not readable (%s): the report leaves it out", trial.number, path,
                        one_line(exc))
            continue
        probes.append(probe)
    return probes


def _trials(path: Path, study_name: Optional[str]) -> List[Any]:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(path)))
    names = [summary.study_name for summary in optuna.get_all_study_summaries(storage)]
    if study_name not in names:
        if not names:
            raise InputError(f"{path} holds no study (empty, or damaged): run the search again to write a report")
        if len(names) > 1:
            raise InputError(f"{path} holds {len(names)} studies and best.json names none of them: run the "
                             "search again to write a report")
        study_name = names[0]
    return optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)


def gather(out_dir: Path) -> ReportData:
    best = read_best(out_dir)
    study = best.get("study") or {}
    fingerprint = study.get("fingerprint")
    data = ReportData(out_dir, best, read_probes(out_dir, study.get("name"),
                                                 fingerprint if isinstance(fingerprint, str) else None))
    calibration = _calibration(best)
    if calibration is not None:
        data.curves = _curves(data, calibration)
        chosen = _chosen(data)
        if chosen is not None:
            ledger = _predict(calibration, chosen)
            if ledger is not None:
                from autofit.memory_model import TERMS

                terms = {term: float(getattr(ledger, term)) for term in TERMS}
                if all(math.isfinite(value) for value in terms.values()):  # a crafted model predicts inf or nan
                    data.ledger, data.ledger_phase = terms, str(ledger.phase)
    return data


def _calibration(best: Dict[str, Any]):
    stored = best.get("memory_model")
    if not stored:
        return None
    from autofit.memory_model import Calibration

    try:
        return Calibration.from_dict(stored)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError):
        return None


def _predict(calibration, candidate: Candidate):
    from autofit.memory_model import predict_calibrated

    try:
        return predict_calibrated(candidate, calibration, calibration.shape)
    except (KeyError, ValueError, ZeroDivisionError, TypeError, AttributeError, OverflowError):
        return None


def _chosen(data: ReportData) -> Optional[Candidate]:
    verified = [record for record in data.best.get("candidates", []) if record.get("kind") == "verify"]
    if not data.best.get("fits") or not verified:
        return None
    described = (data.best.get("verified") or {}).get("candidate") or verified[-1]["candidate"]  # a tie: two runs
    matches = [p.candidate for p in data.probes if p.kind == "verify" and p.candidate.describe() == described]
    return matches[-1] if matches else None


def _level_calibration(data: ReportData, level: int, calibration):
    """The model calibrated on the level's own probes that fitted (one calibration for every level leaves each
    level's curve off its own points by the fit's residual: a few MiB between checkpointing and not), else the
    search's calibration."""
    from autofit.memory_model import calibrate

    own = [(p.candidate, p.peak_bytes) for p in data.probes
           if p.level == level and p.kind == "probe" and p.outcome == "OK" and p.peak_bytes]
    if not own:
        return calibration
    try:
        return calibrate(own, calibration.shape, device=calibration.device)
    except (KeyError, ValueError, ZeroDivisionError, TypeError, AttributeError, OverflowError):
        return calibration


def _curves(data: ReportData, calibration) -> Dict[int, List[Tuple[int, float]]]:
    """The model along the searched axis for each level probed (its last probe as the template), calibrated on that
    level's probes."""
    curves = {}
    effective = (data.best.get("search") or {}).get("effective_batch") or 1
    for level in sorted({p.level for p in data.probes if p.kind == "probe"}):
        own_calibration = _level_calibration(data, level, calibration)
        template = [p.candidate for p in data.probes if p.kind == "probe" and p.level == level][-1]
        if data.axis == "micro_batch":
            points = [template.replace(micro_batch=mb, grad_accum=effective // mb)
                      for mb in range(1, effective + 1) if effective % mb == 0]
            xs = [candidate.micro_batch for candidate in points]
        else:
            lengths = [p.candidate.max_length for p in data.probes if p.level == level]
            low, high = min(lengths), max(lengths)
            xs = sorted({round(low * (high / low) ** (i / (LENGTH_POINTS - 1))) for i in range(LENGTH_POINTS)}
                        | set(lengths)) if high > low else [low]
            points = [template.replace(max_length=x) for x in xs]
        curve = []
        for x, candidate in zip(xs, points, strict=True):
            ledger = _predict(own_calibration, candidate)
            if ledger is not None and math.isfinite(ledger.total):
                curve.append((x, float(ledger.total)))
        curves[level] = curve
    return curves
