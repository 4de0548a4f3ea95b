"""What the answer says of vLLM (GRPO and RLOO with ``--use-vllm``): its share as the ledger predicts it (weights,
profiling peak, non-torch memory, CUDA graphs, KV cache, tokens, what it spends beyond the share) beside what the
probes measured of it (vLLM's own figures and its meter's peaks, ``autofit.rungs.vllm._probe``), and, for server
mode, the ``trl vllm-serve`` command to run beside the training."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from autofit import memory_model
from autofit.core import Candidate, format_size
from autofit.search import SearchReport

MEASURED = ("vllm_init_peak_bytes", "vllm_generation_peak_bytes", "vllm_weight_sync_peak_bytes",
            "vllm_kv_cache_bytes", "vllm_kv_tokens", "vllm_max_model_len", "vllm_weight_sync",
            "vllm_server_start_seconds")


def _stats(report: SearchReport) -> Dict[str, Any]:
    assert report.chosen is not None and report.verified is not None  # asked of a fit only
    return {**report.chosen.result.stats, **report.verified.stats}


def vllm_data(report: SearchReport, candidate: Candidate, model: str) -> Optional[Dict[str, Any]]:
    """best.json's ``vllm``: the mode, the share, the ledger's prediction and the probes' measurement (``model``: as
    best.yaml names it)."""
    if not candidate.vllm:
        return None
    stats = _stats(report)
    data: Dict[str, Any] = {"mode": candidate.vllm, "utilization": candidate.vllm_utilization,
                            "share_bytes": candidate.vllm_share_bytes,
                            "max_model_length": candidate.vllm_max_model_length,
                            "probed": stats.get("vllm") == candidate.vllm,
                            "measured": {key.removeprefix("vllm_"): stats[key] for key in MEASURED if key in stats}}
    shape = memory_model.shape_or_none(candidate.model)
    if candidate.vllm == "colocate" and shape is not None:
        share = memory_model.candidate_share(candidate, shape)
        data["predicted"] = {"weights_bytes": round(share.weights), "profile_peak_bytes": round(share.profile_peak),
                             "non_torch_bytes": round(share.non_torch), "cuda_graphs_bytes": round(share.cuda_graphs),
                             "cuda_graphs": {"piecewise": share.graphs[0], "full": share.graphs[1]},
                             "beyond_share_bytes": memory_model.VLLM_UNMODELLED_BAND[1],
                             "kv_cache_bytes": round(max(share.kv_cache, 0.0)),
                             "kv_tokens": int(max(share.kv_cache, 0.0) // share.kv_per_token),
                             "max_model_len": share.max_model_len, "starts": share.starts,
                             "holds_the_batch": share.holds_the_batch}
        if candidate.device == "cpu" and data["probed"]:
            data["note"] = ("on the simulated device vLLM's CPU build sizes its KV cache by VLLM_CPU_KVCACHE_SPACE "
                            "(whole GiB, in host memory), not by its share of the card: the measured cache is that "
                            "space; the share is held in every phase's peak")
    if candidate.vllm == "server":
        data["server_command"] = server_command(candidate, model)
        if candidate.vllm_server_gpus:
            data.update(server_gpus=candidate.vllm_server_gpus, trainer_gpus=candidate.ranks,
                        trainer_devices=trainer_devices(candidate))
    return data


def server_command(candidate: Candidate, model: str) -> str:
    """The ``trl vllm-serve`` line for server mode: the model and the context the probes served it with; where the
    vllm-server rung placed it, on the node's last GPUs (the trainer's ranks take the first), tensor parallel."""
    context = candidate.vllm_max_model_length or (candidate.prompt_length or 0) + candidate.max_length
    gpus = candidate.vllm_server_gpus
    if not gpus:
        return (f"trl vllm-serve --model {model} --max_model_len {context} "
                "--gpu_memory_utilization 0.9  # on GPUs of its own, beside the training")
    devices = ",".join(str(candidate.ranks + i) for i in range(gpus))
    return (f"CUDA_VISIBLE_DEVICES={devices} trl vllm-serve --model {model} --tensor_parallel_size {gpus} "
            f"--max_model_len {context} --gpu_memory_utilization 0.9")


def trainer_devices(candidate: Candidate) -> str:
    """The GPUs the trainer's ranks run on beside a placed server: the node's first ``ranks``."""
    return ",".join(str(i) for i in range(candidate.ranks))


def vllm_comments(report: SearchReport, candidate: Candidate, model: str) -> List[str]:
    """best.yaml's comment lines on vLLM."""
    if candidate.vllm == "server" and candidate.vllm_server_gpus:
        return [f"# vLLM server mode on {candidate.vllm_server_gpus} of the node's "
                f"{candidate.ranks + candidate.vllm_server_gpus} GPUs (vllm-server): start it first, "
                f"{server_command(candidate, model)}",
                f"# then the training on the other {candidate.ranks}: "
                f"CUDA_VISIBLE_DEVICES={trainer_devices(candidate)} before the launch line "
                f"({candidate.ranks} process{'es' if candidate.ranks > 1 else ''})"]
    if candidate.vllm == "server":
        return [f"# vLLM server mode: start it first, {server_command(candidate, model)}"]
    if candidate.vllm != "colocate" or not candidate.vllm_share_bytes:
        return []
    stats = _stats(report)
    measured = ""
    if "vllm_generation_peak_bytes" in stats:
        measured = (f"; probed with vLLM generating (its own peak {format_size(stats['vllm_generation_peak_bytes'])}"
                    + (", the CPU build's KV cache in host memory" if candidate.device == "cpu" else "") + ")")
    return [f"# vLLM colocated: {candidate.vllm_utilization:.0%} of each GPU "
            f"({format_size(candidate.vllm_share_bytes)}) held through every phase{measured}"]
