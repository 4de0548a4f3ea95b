"""The Python API, ``autofit.fit``, and the one orchestration that the CLI shares with it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional, Union

from autofit import export
from autofit.candidate import Candidate
from autofit.device import NoCudaDeviceError, first_gpu, resolve_device
from autofit.factory import FactoryError, factory_ref
from autofit.faults import InfrastructureError
from autofit.ladder import Rung
from strategies import resolve_ladder
from autofit.registry import UnknownModelError, resolve_model
from autofit.runner import ProcessRunner
from autofit.report import SearchReport
from autofit.search import Search
from autofit.spec import InputError, SearchSpec, format_size, parse_size

log = logging.getLogger(__name__)


class NoFitError(RuntimeError):
    """Nothing fits the budget, even at the last rung of the ladder."""

    def __init__(self, message: str, report: SearchReport):
        super().__init__(message)
        self.report = report


@dataclass
class FitResult:
    candidate: Candidate
    report: SearchReport
    best_json: Path
    best_yaml: Path

    @property
    def training_args(self) -> Dict[str, Any]:
        return self.candidate.training_args()


def budget_for(device: str, gpu_memory: Union[None, str, int]) -> Optional[int]:
    """The budget in bytes: --gpu-memory, else (on CUDA) the card's memory."""
    if gpu_memory is not None:
        return gpu_memory if isinstance(gpu_memory, int) else parse_size(gpu_memory)
    if device == "cuda":
        gpu = first_gpu()
        return gpu.total_bytes if gpu else None
    return None


def run_search(spec: SearchSpec, rungs: Optional[Iterable[Rung]] = None) -> SearchReport:
    """Validate the model, run the search in probe processes, write best.yaml/best.json; returns the report."""
    try:
        resolve_model(spec.model)
    except UnknownModelError as exc:
        raise InputError(str(exc)) from None
    try:
        ref = factory_ref(spec.factory or spec.algo)
    except FactoryError as exc:
        raise InputError(str(exc)) from None
    rungs = list(rungs) if rungs is not None else resolve_ladder(spec.ladder)
    spec.out_dir.mkdir(parents=True, exist_ok=True)
    runner = ProcessRunner(ref, spec.budget_bytes, spec.out_dir, timeout_s=spec.probe_timeout_s)
    log.info(
        "autofit: %s %s on %s, budget %s, effective batch %d, max_length %d, maximize %s",
        spec.algo, spec.model, spec.device, format_size(spec.budget_bytes), spec.effective_batch, spec.max_length,
        spec.maximize,
    )
    search = Search(spec, runner, rungs)
    try:
        search.run()
    except (FactoryError, InfrastructureError):
        export.write(search.report, spec.out_dir)  # best.json says what was measured and why it stopped
        raise
    export.write(search.report, spec.out_dir)
    return search.report


def no_fit_message(report: SearchReport) -> str:
    spec = report.spec
    failure = report.lightest_failure()
    last = report.levels[-1]
    if failure is not None:
        seen = (f"the lightest configuration tried ({'+'.join(failure.candidate.rungs) or 'baseline'}: "
                f"{failure.candidate.describe()}) needed more than {format_size(failure.result.peak_bytes)}")
    elif report.skipped and not report.records:
        lightest = min(report.skipped, key=lambda s: s.predicted_bytes)
        seen = (f"the memory model puts the lightest configuration ({'+'.join(lightest.candidate.rungs) or 'baseline'}: "
                f"{lightest.candidate.describe()}) at {format_size(lightest.predicted_bytes)} "
                f"± {lightest.uncertainty:.0%}, so nothing was probed (--no-predict probes anyway)")
    else:
        errors = sorted({r.result.error for r in report.records if r.result.error})
        seen = "no probe ran to completion" + (f" (first error: {errors[0][:200]})" if errors else "")
    return (
        f"nothing fits in {format_size(spec.budget_bytes)} even with {', '.join(last.rungs) or 'no rung'}: {seen}. "
        "Try a larger --gpu-memory, a lower --min-length, a smaller --effective-batch, or more rungs in --ladder."
    )


def fit(
    trainer_factory: Union[str, Callable[[Candidate], Any]],
    *,
    model: str,
    algo: str = "sft",
    gpu_memory: Union[None, str, int] = None,
    device: str = "auto",
    max_length: int = 1024,
    min_length: Optional[int] = None,
    effective_batch: int = 8,
    maximize: str = "batch",
    ladder: Optional[Iterable[Union[str, Rung]]] = None,
    training_args: Optional[Dict[str, Any]] = None,
    out_dir: Union[str, Path] = "autofit-out",
    probe_steps: int = 2,
    verify_steps: Union[int, str] = "auto",
    probe_timeout_s: float = 900.0,
    max_probes: Optional[int] = None,
    headroom: Optional[float] = None,
    predict: bool = True,
    dtype: Optional[str] = None,
) -> FitResult:
    """Find the best configuration of your own trainer that fits the memory budget.

    ``trainer_factory(candidate)`` must build a ready transformers/TRL ``Trainer`` from the candidate's settings:
    ``YourConfig(**candidate.training_args())``, ``peft_config=candidate.peft_config()``,
    ``quantization_config=candidate.quantization_config()``. It runs in fresh probe processes, so it must be
    importable: a module-level function (in a script, call ``fit`` under ``if __name__ == "__main__":``).
    ``max_probes``, ``headroom`` and ``predict`` are the CLI's ``--max-probes``, ``--headroom`` and
    ``--no-predict`` (False). Raises ``InputError`` on bad input, ``FactoryError`` (an ``InputError``) when your
    factory fails, ``InfrastructureError`` when probes cannot run on this machine (the same non-memory error on
    two candidates), and ``NoFitError`` when nothing fits.
    """
    if device not in ("auto", "cuda", "cpu"):
        raise InputError(f"device '{device}' is not valid: accepted are auto, cuda, cpu")
    try:
        resolved = resolve_device(device)
    except NoCudaDeviceError as exc:
        raise InputError(str(exc)) from None
    custom = [r for r in ladder or () if not isinstance(r, str)]
    spec = SearchSpec(
        model=model,
        algo=algo,
        device=resolved,
        budget_bytes=budget_for(resolved, gpu_memory),
        max_length=max_length,
        min_length=min_length,
        effective_batch=effective_batch,
        maximize=maximize,
        ladder=[r if isinstance(r, str) else r.name for r in ladder] if ladder is not None and not custom else None,
        user_args=dict(training_args or {}),
        factory=factory_ref(trainer_factory),
        out_dir=Path(out_dir),
        probe_steps=probe_steps,
        verify_steps=verify_steps,
        probe_timeout_s=probe_timeout_s,
        max_probes=max_probes,
        headroom=headroom,
        predict=predict,
        dtype=dtype,
    )
    rungs = None
    if custom:
        rungs = [resolve_ladder([r])[0] if isinstance(r, str) else r for r in ladder]
    report = run_search(spec, rungs)
    if not report.fits:
        raise NoFitError(no_fit_message(report), report)
    return FitResult(report.chosen.candidate, report, spec.out_dir / "best.json", spec.out_dir / "best.yaml")
