"""Writes the search's answer: best.yaml (for ``trl <algo> --config``), best.json (structured), and the table."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from autofit import memory_model
from autofit.core import (
    RL_ALGOS,
    Candidate,
    algorithm,
    atomic_write_text,
    first_gpu,
    format_size,
    installed_versions,
    one_line,
    resolve_model,
)
from autofit.export._engine import engine_comments, engine_data, exported_engine, host_memory_data
from autofit.export._user_yaml import user_yaml
from autofit.export._words import trades, why
from autofit.probe.kit import trainable_checkpoint, trainable_folder
from autofit.rungs import ACCELERATE_YAML, remove_stale_engine_files, write_engine_files
from autofit.search import STUDY_FILE, InfrastructureError, SearchReport, over_margin, read_user_config

log = logging.getLogger(__name__)

PACKAGES = ("trl-autofit", "torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "optuna")




def loadable_name(candidate: Candidate) -> str:
    """The model as TRL should load it: a hub id or folder as given; for a bundled toy model without a hub id
    (tiny-qwen2), a random-weight checkpoint of it (the probes loaded a weightless one), which ``write`` builds
    after best.json and best.yaml are written."""
    source = resolve_model(candidate.model)
    if source.local_path or "/" in candidate.model:
        return source.local_path or candidate.model
    return str(trainable_folder(source.config, candidate.model))


def _build_trainable(report: SearchReport, out_dir: Path) -> None:
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


def model_args(candidate: Candidate, observed: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """TRL ``ModelConfig`` fields (the CLI's model, LoRA and quantization flags, the attention implementation the
    probes measured)."""
    args: Dict[str, Any] = {"model_name_or_path": loadable_name(candidate)}
    if candidate.lora is not None:
        args.update(
            use_peft=True,
            lora_r=candidate.lora.r,
            lora_alpha=candidate.lora.alpha,
            lora_dropout=candidate.lora.dropout,
            lora_target_modules=_targets(candidate.lora.target_modules),
        )
    if candidate.dtype is not None:
        args["dtype"] = candidate.dtype  # TRL's ModelConfig --dtype (the scripts pass it as model_init_kwargs)
    if candidate.quantization == "8bit":
        args["load_in_8bit"] = True
    elif candidate.quantization == "4bit":
        args.update(load_in_4bit=True, bnb_4bit_quant_type="nf4", use_bnb_nested_quant=True)
    if observed and observed.get("attn_implementation"):
        args["attn_implementation"] = observed["attn_implementation"]
    return args


def _targets(targets: Any) -> Any:
    """LoRA's target modules as YAML and JSON write them: a name, or a list."""
    return list(targets) if isinstance(targets, tuple) else targets


def as_trained(candidate: Candidate, observed: Dict[str, Any]) -> Candidate:
    """The candidate with what the user's trainer adds on its own (read back in the probe): its LoRA, its 4/8-bit
    base, its number of generations. Exported as measured: a best.yaml without the user's LoRA would describe a full
    fine-tune that does not fit."""
    from autofit.core import LoraSettings

    changes: Dict[str, Any] = {}
    peft = (observed or {}).get("peft")
    if peft and candidate.lora is None:
        changes["lora"] = LoraSettings(r=peft.get("r") or 16, alpha=peft.get("lora_alpha") or 32,
                                       dropout=peft.get("lora_dropout") or 0.0,
                                       target_modules=peft.get("target_modules") or "all-linear")
    quantization = (observed or {}).get("quantization") or {}
    if candidate.quantization is None and (quantization.get("load_in_4bit") or quantization.get("load_in_8bit")):
        changes["quantization"] = "4bit" if quantization.get("load_in_4bit") else "8bit"
    generations = (observed or {}).get("args", {}).get("num_generations")
    if candidate.is_rl and candidate.num_generations is None and isinstance(generations, int):
        changes["num_generations"] = generations
    return candidate.replace(**changes) if changes else candidate


def usage(algo: str, offload: Optional[str] = None, written: Tuple[str, ...] = ()) -> str:
    """How the answer runs; ``written``: the keys of the user's own file, which may name the data and rewards."""
    unit = algorithm(algo)
    if unit.trl_command is None:
        return unit.usage or f"# build {unit.config_class.rsplit(':', 1)[-1] or 'your config'}(**best.json['config'])"
    engine = f" --accelerate_config {ACCELERATE_YAML}" if offload else ""
    data = "" if {"dataset_name", "datasets"} & set(written) else " --dataset_name YOUR_DATASET"
    rewards = ""  # TRL's grpo and rloo commands need a reward: a function of the registry or a module's, or a model
    if unit.groups and not {"reward_funcs", "reward_model_name_or_path"} & set(written):
        rewards = " --reward_funcs YOUR_REWARD"
    return f"# use: trl {unit.trl_command} --config best.yaml{engine}{data}{rewards}"


def _scalar(value: Any) -> str:
    """One YAML line: strings double-quoted, in UTF-8; escaped (JSON's, YAML's \\U) only what cannot stand as it is."""
    if isinstance(value, str):  # an emoji as it is: JSON's \ud83d\ude80 load in YAML as two lone surrogates
        return "".join(c if c.isprintable() else f"\\U{ord(c):08x}" for c in json.dumps(value, ensure_ascii=False))
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip().removesuffix("...").strip()


def user_file(report: SearchReport) -> Tuple[str, List[Dict[str, Any]]]:
    """best.yaml as the user's own config file with the answer's changes, and the changes (``--config``)."""
    fit, spec = report.chosen, report.spec
    assert fit is not None and report.verified is not None and spec.options.config
    observed = report.verified.observed or fit.result.observed or {}
    candidate = as_trained(fit.candidate, observed)
    exported = {**model_args(candidate, observed), **candidate.training_args()}
    return user_yaml(read_user_config(spec.options.config, spec.options.algo), candidate, exported,
                     lambda key: why(key, candidate, spec.max_length, spec.options.maximize), _header(report))


def _header(report: SearchReport) -> List[str]:
    fit, spec = report.chosen, report.spec
    assert fit is not None and report.verified is not None
    candidate = fit.candidate
    written: Tuple[str, ...] = ()
    if spec.options.config:
        written = tuple(read_user_config(spec.options.config, spec.options.algo).written)
    lines = [
        f"# autofit: best {one_line(spec.options.algo)} configuration for {one_line(spec.options.model)} within "
        f"{format_size(spec.budget_bytes)}",
        f"# verified peak {format_size(report.verified.peak_bytes)} over {report.verified.steps} steps; "
        f"rungs: {', '.join(candidate.rungs) or 'none'}",
        usage(one_line(spec.options.algo), exported_engine(report), written),
    ]
    lines += engine_comments(report, candidate)
    if candidate.is_rl and candidate.prompt_length:
        lines.append(f"# measured with prompts of {candidate.prompt_length} tokens: TRL {one_line(spec.options.algo)} "
                     "does not truncate prompts, so keep yours this short (or search with --max-prompt-length)")
    return lines


def yaml_text(report: SearchReport) -> str:
    fit, spec = report.chosen, report.spec
    assert fit is not None and report.verified is not None  # written for a fit only, and a fit is verified
    if spec.options.config:
        return user_file(report)[0]
    candidate = as_trained(fit.candidate, report.verified.observed or fit.result.observed)
    defaults = fit.result.config_defaults or report.verified.config_defaults
    train = {k: v for k, v in candidate.training_args().items() if k not in defaults or defaults[k] != v}
    lines = _header(report)
    observed = report.verified.observed or fit.result.observed or {}
    for key, value in {**model_args(candidate, observed), **train}.items():
        lines.append(f"{key}: {_scalar(value)}  "
                     f"# {one_line(why(key, candidate, spec.max_length, spec.options.maximize))}")
    if candidate.env:
        lines.append("env:")
        for key, value in candidate.env:
            lines.append(f"  {key}: {_scalar(value)}  "
                         f"# {one_line(why(f'env.{key}', candidate, spec.max_length, spec.options.maximize))}")
    return "\n".join(lines) + "\n"


def _peft_dict(candidate: Candidate) -> Optional[Dict[str, Any]]:
    if candidate.lora is None:
        return None
    return {"type": "lora", "r": candidate.lora.r, "lora_alpha": candidate.lora.alpha,
            "lora_dropout": candidate.lora.dropout, "target_modules": _targets(candidate.lora.target_modules)}


def _quantization_dict(candidate: Candidate) -> Optional[Dict[str, Any]]:
    if candidate.quantization == "8bit":
        return {"load_in_8bit": True}
    if candidate.quantization == "4bit":
        return {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}
    return None


def json_data(report: SearchReport, out_dir: Optional[Path] = None) -> Dict[str, Any]:
    spec = report.spec
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
        "study": {"name": spec.study_name(), "journal": STUDY_FILE},
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
        "margin": round(report.margin, 4),
        "stopped": report.stopped,
        "versions": installed_versions(PACKAGES),
        "memory_model": report.calibration.to_dict() if report.calibration is not None else None,
        "prediction_error": prediction_error(report),
    }
    if report.fits:
        fit, verified = report.chosen, report.verified
        assert fit is not None and verified is not None  # a fit is verified
        candidate = as_trained(fit.candidate, verified.observed or fit.result.observed)
        data.update(
            peak_bytes=max(verified.peak_bytes, fit.result.peak_bytes),
            tokens_per_second=round(verified.tokens_per_second, 1),
            generation_tokens_per_second=round(verified.generation_tokens_per_second, 1) or None,
            rungs=list(candidate.rungs),
            trades=trades(candidate, spec.max_length, memory_model.shape_or_none(spec.options.model)),
            cost_class=report.levels[fit.level].cost,
            config=candidate.training_args(),
            config_class=verified.config_class,
            model_args=model_args(candidate, verified.observed or fit.result.observed),
            peft=_peft_dict(candidate),
            quantization=_quantization_dict(candidate),
            env=dict(candidate.env),
            engine=engine_data(report, candidate, out_dir),
            host_memory=host_memory_data(report, candidate),
            phase_peaks=fit.result.phase_peaks,
            probe={"steps": fit.result.steps, "peak_bytes": fit.result.peak_bytes},
            changes=user_file(report)[1] if spec.options.config else None,
            verified={"steps": verified.steps, "peak_bytes": verified.peak_bytes, "phase_peaks": verified.phase_peaks,
                      "outcome": verified.outcome.value, "stats": verified.stats},
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


def _outcome_cell(result, budget: Optional[int] = None, margin: float = 0.0) -> str:
    """OOM with the phase that ran out (the optimizer step, generation, ...): where the memory went; a fit of the
    budget that the margin rejected, with by how much."""
    if result.outcome.value == "OOM" and result.error_phase:
        return f"OOM in {result.error_phase}"
    over = over_margin(result, budget, budget * (1 - margin)) if budget is not None else None
    if over is not None:
        return f"OK, over the margin by {format_size(over)}"
    return result.outcome.value


def table_text(report: SearchReport) -> str:
    """One row per probe. tok/s is training throughput (prompt and completion tokens per second of whole steps);
    for RL, gen tok/s is the generation phase alone (completion tokens per second of generation)."""
    generation = any(r.result.generation_tokens_per_second for r in report.records)
    header = ("#", "kind", "rungs", "candidate", "outcome", "peak", "tok/s") + (("gen tok/s",) if generation else ())
    rows: List[Tuple[str, ...]] = [header]
    for index, r in enumerate(report.records, 1):
        row: Tuple[str, ...] = (
            str(index), ("refine" if r.stage == "refine" else r.kind) + ("*" if r.cached else ""),
            "+".join(r.candidate.rungs) or "baseline", r.candidate.describe(),
            _outcome_cell(r.result, report.spec.budget_bytes, report.margin),
            format_size(r.result.peak_bytes), f"{r.result.tokens_per_second:,.0f}" if r.result.fits else "-",
        )
        if generation:
            rate = r.result.generation_tokens_per_second
            row += (f"{rate:,.0f}" if r.result.fits and rate else "-",)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any(r.cached for r in report.records):
        lines.append("* stored: measured by an earlier run of this search (same --out), not repeated")
    if report.skipped:
        lines.append("not probed, predicted over the budget even at the low end of the model's error band: "
                     + "; ".join(f"{s.candidate.describe()} ({format_size(s.predicted_bytes)} ± {s.uncertainty:.0%})"
                                 for s in report.skipped))
    return "\n".join(lines)


def write(report: SearchReport, out_dir: Path) -> Dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "best.json", "yaml": out_dir / "best.yaml"}
    atomic_write_text(paths["json"], json.dumps(json_data(report, out_dir), indent=2, default=str) + "\n")
    engine = exported_engine(report) if report.fits else None
    if engine:
        assert report.chosen is not None  # an engine is exported for a fit only
        chosen = report.chosen.candidate
        paths.update(write_engine_files(out_dir, engine, chosen.device, chosen.ranks, report.spec.options.nodes))
    else:
        remove_stale_engine_files(out_dir)
    if report.fits:
        atomic_write_text(paths["yaml"], yaml_text(report))
        _build_trainable(report, out_dir)
    else:
        paths["yaml"].unlink(missing_ok=True)  # a stale answer from an earlier search would mislead
    return paths
