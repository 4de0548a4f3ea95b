"""What best.json and best.yaml say about the engine a configuration runs under: optimizer offload, activation
offloading, several GPUs and several machines (their files, the launch line, host memory, the ranks' peaks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from autofit import memory_model
from autofit.core import DDP, Candidate, format_size
from autofit.rungs import ACCELERATE_YAML, DEEPSPEED_JSON, ZERO_STAGES, launch_line, replacement_trade
from autofit.search import SearchReport


def exported_engine(report: SearchReport) -> Optional[str]:
    """The engine of the chosen configuration; data parallel when it is exported for several machines."""
    assert report.chosen is not None  # asked of a fit only
    engine = report.chosen.candidate.engine
    return engine or (DDP if report.spec.options.nodes > 1 else None)


def _stat(report: SearchReport, key: str):
    assert report.chosen is not None and report.verified is not None  # asked of a fit only, and a fit is verified
    return report.verified.stats.get(key) or report.chosen.result.stats.get(key)


def world_peak(report: SearchReport, candidate: Candidate) -> Optional[float]:
    """The ledger's per-GPU peak at the whole world size (every node's ranks), calibrated when the search was."""
    if report.spec.options.nodes == 1:
        return None
    shape = memory_model.shape_or_none(candidate.model)
    if shape is None:
        return None
    world = candidate.replace(ranks=candidate.ranks * report.spec.options.nodes)
    return memory_model.predict_calibrated(world, report.calibration, shape).total


def engine_data(report: SearchReport, candidate: Candidate, out_dir: Optional[Path]) -> Optional[Dict[str, Any]]:
    """best.json's account of the engine (optimizer offload, several GPUs or machines): its files, the launch line,
    the ranks, host memory measured and predicted."""
    engine = exported_engine(report)
    if not engine:
        return None
    folder = Path(out_dir or report.spec.options.out_dir).resolve()
    shape = memory_model.shape_or_none(candidate.model)
    predicted = memory_model.host_bytes(candidate, shape, candidate.device) if shape is not None else None
    at_world = world_peak(report, candidate)
    return {
        "name": engine,
        "ranks": candidate.ranks,
        "nodes": report.spec.options.nodes,
        "world_size": candidate.ranks * report.spec.options.nodes,
        "accelerate_config": str(folder / ACCELERATE_YAML),
        "deepspeed_config": str(folder / DEEPSPEED_JSON) if engine in ZERO_STAGES else None,
        "launch": launch_line(candidate.algo, folder / "best.yaml", folder / ACCELERATE_YAML),
        "host_bytes": _stat(report, "host_bytes"),
        "host_bytes_predicted": round(predicted) if predicted else None,
        "peak_bytes_predicted_at_world_size": round(at_world) if at_world else None,
    }


def host_memory_data(report: SearchReport, candidate: Candidate) -> Optional[Dict[str, Any]]:
    """best.json's host memory the offloading rungs need (pinned on a GPU machine): measured and predicted."""
    if not (candidate.optimizer_offload or memory_model.activation_policy(candidate).offloads_activations):
        return None
    measured = {key: _stat(report, key) for key in ("host_bytes", "activation_host_bytes") if _stat(report, key)}
    shape = memory_model.shape_or_none(candidate.model)
    predicted = memory_model.host_bytes(candidate, shape, candidate.device) if shape is not None else None
    return {"bytes": sum(measured.values()) or None, "predicted_bytes": round(predicted) if predicted else None,
            "optimizer_bytes": measured.get("host_bytes"), "activation_bytes": measured.get("activation_host_bytes"),
            "activation_kept_on_device_bytes": _stat(report, "activation_kept_bytes")}


def engine_comments(report: SearchReport, candidate: Candidate) -> List[str]:
    """best.yaml's comment lines on the engine, host memory and ranks."""
    lines = []
    if candidate.replaces:  # an engine of autofit's instead of the launch's own: its trade
        lines.append(f"# {replacement_trade(candidate)}")
    if candidate.optimizer_offload:
        host = _stat(report, "host_bytes")
        lines.append(f"# optimizer offload ({candidate.engine}, {ACCELERATE_YAML} + {DEEPSPEED_JSON}): fp32 master "
                     "weights, gradients and AdamW states in host memory"
                     + (f" ({format_size(host)} measured)" if host else "") + "; same math, slower steps")
    nodes = report.spec.options.nodes
    if candidate.ranks > 1 or nodes > 1:
        peaks = _stat(report, "rank_peak_bytes") or []
        where = f"{candidate.ranks} GPUs" + (f" x {nodes} machines" if nodes > 1 else "")
        lines.append(f"# {where} ({exported_engine(report)}, {ACCELERATE_YAML}): the batch size and accumulation are "
                     f"per GPU, {candidate.effective_batch * nodes} sequences per optimizer step in all"
                     + (f"; peak per GPU {', '.join(format_size(p) for p in peaks)}" if peaks else ""))
    if nodes > 1:
        at_world = world_peak(report, candidate)
        lines.append(f"# measured on one machine of {candidate.ranks} GPU(s); at world size {candidate.ranks * nodes} "
                     "the memory model predicts "
                     + (f"{format_size(at_world)} per GPU" if at_world else "no figure (unknown model sizes)")
                     + " (ZeRO-3 and FSDP2 shard by the world size); on each machine set machine_rank and "
                     "main_process_ip in accelerate.yaml")
    if memory_model.activation_policy(candidate).offloads_activations:
        host, kept = _stat(report, "activation_host_bytes"), _stat(report, "activation_kept_bytes")
        lines.append("# activation offloading: saved activations in host memory until the backward pass"
                     + (f" (at most {format_size(host)} measured)" if host else "") + "; same math, slower steps")
        if kept:  # see autofit/rungs/activation_offload/_probe.py
            lines.append(f"# TRL kept up to {format_size(kept)} of them on the GPU in the probe: a freed address of "
                         "one it had offloaded was reused, and its deduplication took the new tensor for the old")
    return lines
