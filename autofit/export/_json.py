"""best.json: the answer structured, with what was measured, every probe, what was skipped and how far the memory
model's predictions were from the measured peaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from autofit.core import RL_ALGOS, installed_versions
from autofit.export._answer import Answer
from autofit.export._answer import answer as derive
from autofit.machine import first_gpu
from autofit.search import STUDY_FILE, SearchReport

PACKAGES = ("trl-autofit", "torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "optuna")


def json_data(report: SearchReport, out_dir: Optional[Path] = None, answer: Optional[Answer] = None) -> Dict[str, Any]:
    """best.json: what the search measured and decided, and its ``answer`` (derived here where not given)."""
    spec = report.spec
    answer = answer if answer is not None else derive(report, out_dir)
    gpu = first_gpu() if spec.device == "cuda" else None
    data: Dict[str, Any] = {
        "fits": report.fits,
        "model": spec.options.model,
        "algo": spec.options.algo,
        "device": spec.device,
        "gpu": gpu.name if gpu else None,
        "budget_bytes": spec.budget_bytes,
        "probes": report.probes_total,
        "probes_this_run": report.probes_run,
        "side_by_side": report.side_by_side,
        "search": {
            "maximize": spec.options.maximize,
            "effective_batch": spec.options.effective_batch,
            "max_length": spec.max_length,
            "min_length": spec.min_length,
            "ladder": [rung for state in report.levels[:report.ladder_len] for rung in state.rungs[-1:]],
            "probe_steps": spec.options.probe_steps,
            "verify_steps": spec.options.verify_steps,
            "prompt_length": spec.options.max_prompt_length if spec.options.algo in RL_ALGOS else None,
        },
        "notes": report.notes,
        "request": spec.options.record(),
        "study": {"name": spec.study_name(), "journal": STUDY_FILE, "fingerprint": report.fingerprint or None},
        "candidates": [
            {
                "kind": r.kind,
                "rungs": list(r.candidate.rungs),
                "candidate": r.candidate.describe(),
                "outcome": r.result.outcome.value,
                "peak_bytes": r.result.peak_bytes,
                "tokens_per_second": round(r.result.tokens_per_second, 1),
                "error": r.result.error or None,
                "error_phase": r.result.error_phase or None,
                "fault": r.result.fault or None,
                "origin": r.result.origin or None,
                "log": r.result.log_path or None,
                "generation_tokens_per_second": round(r.result.generation_tokens_per_second, 1) or None,
                "predicted_bytes": round(r.predicted_bytes) if r.predicted_bytes is not None else None,
                "prior_predicted_bytes": round(r.prior_bytes) if r.prior_bytes is not None else None,
                "stored": r.cached,
                "stage": r.stage,
            }
            for r in report.records
        ],
        "skipped": [
            {
                "rungs": list(s.candidate.rungs),
                "candidate": s.candidate.describe(),
                "predicted_bytes": round(s.predicted_bytes),
                "uncertainty": round(s.uncertainty, 4),
            }
            for s in report.skipped
        ],
        # not timed: predicted slower than a measured fit beyond the throughput model's band (not failures)
        "skipped_by_speed": [
            {
                "rungs": list(s.candidate.rungs),
                "candidate": s.candidate.describe(),
                "predicted_tokens_per_second": round(s.predicted_tps, 1),
                "than": s.than.describe(),
                "than_predicted_tokens_per_second": round(s.than_predicted_tps, 1),
                "band": round(s.band, 4),
            }
            for s in report.speed_skipped
        ],
        "margin": round(report.margin, 4),
        "stopped": report.stopped,
        "versions": installed_versions(PACKAGES),
        "memory_model": report.calibration.to_dict() if report.calibration is not None else None,
        "speed_model": report.speed_model.to_dict() if report.speed_model is not None else None,
        "prediction_error": prediction_error(report),
    }
    if answer is not None:
        fit, verified = report.chosen, report.verified
        assert fit is not None and verified is not None  # a fit is verified
        data.update(
            peak_bytes=max(verified.peak_bytes, fit.result.peak_bytes),
            tokens_per_second=round(verified.tokens_per_second, 1),
            generation_tokens_per_second=round(verified.generation_tokens_per_second, 1) or None,
            rungs=list(answer.candidate.rungs),
            trades=answer.trades,
            cost_class=report.levels[fit.level].cost,
            config=answer.config,
            config_class=verified.config_class,
            model_args=answer.model_args,
            **answer.blocks,
            env=dict(answer.env),
            engine=answer.engine,
            host_memory=answer.host_memory,
            vllm=answer.vllm,
            phase_peaks=fit.result.phase_peaks,
            probe={"steps": fit.result.steps, "peak_bytes": fit.result.peak_bytes},
            changes=answer.changes,
            train_command=answer.train,
            verified={"candidate": fit.candidate.describe(), "steps": verified.steps, "peak_bytes": verified.peak_bytes,
                      "phase_peaks": verified.phase_peaks, "outcome": verified.outcome.value, "stats": verified.stats},
        )
    else:
        failure = report.lightest_failure()
        data.update(peak_bytes=None, rungs=[], config=None,
                    smallest_oom_peak_bytes=failure.result.peak_bytes if failure else None)
    return data


def prediction_error(report: SearchReport) -> Dict[str, Dict[str, Optional[float]]]:
    """Relative error of the memory model's predictions against the measured peaks of probes that fitted:
    before calibration (the prior alone) and as the search saw it (calibrated on the probes before each one)."""
    measured = [r for r in report.records if r.result.fits and r.result.peak_bytes and not r.cached]

    def errors(attribute: str) -> Dict[str, Optional[float]]:
        values = [abs(getattr(r, attribute) - r.result.peak_bytes) / r.result.peak_bytes
                  for r in measured if getattr(r, attribute) is not None]
        if not values:
            return {"mean": None, "max": None, "points": 0}
        return {"mean": round(sum(values) / len(values), 4), "max": round(max(values), 4), "points": len(values)}

    return {"prior": errors("prior_bytes"), "calibrated": errors("predicted_bytes")}


