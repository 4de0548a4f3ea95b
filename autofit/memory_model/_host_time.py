"""What a step spends on the host and on the link to it (issue 48): the optimizer step an offloading engine runs on
the CPU, the gradients and weights it moves over PCIe, the weights ZeRO-3's and FSDP2's parameter offload fetch for
every pass, and activation offloading's copies where they outrun the compute they overlap.

The host's AdamW is priced per core and per rank: each rank steps its shard on its share of the node's cores, at
the rate the search measures on its machine (``Card.host_*``) or, planning for another, the assumed one.

One term for every door: autofit's optimizer-offload rung, its offloading shardings, and a DeepSpeed configuration of
the user's that offloads (``_engine_settings.host_offload`` reads all three) are the same engine and get the same time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Optional

from autofit.core import Candidate, Card
from autofit.memory_model._activation_policy import activation_policy
from autofit.memory_model._engine_settings import host_offload

HOST_LINK_EFFICIENCY = 0.80  # [M: pinned host copies reach about 25 of PCIe 4's 32 GB/s]
# The host's AdamW, in parameters a second per core, where the host's own are not measured (``Card.host_*``: the
# search measures its machine's, ``autofit.probe._host_adam``) [M: torch 2.13's AdamW and DeepSpeed 0.19.8's CPUAdam
# over 4 million float32 parameters on one core of this project's two-core host, 2026-12-02: 1.5-1.9e8 and
# 6.5e8-1.3e9; ZeRO-Offload (Ren et al. 2021) reports its CPU Adam 5-7x PyTorch's]
TORCH_ADAM_PER_CORE = 1.5e8
CPU_ADAM_PER_CORE = 6.5e8
# What one parameter's step reads and writes of host memory, float32: torch's AdamW loop (weight decay, the first
# moment's lerp, the second's scale and addcmul, the denominator's sqrt, scale and eps, the update) 80 bytes;
# DeepSpeed's fused CPUAdam reads weight, gradient and moments and writes all but the gradient, 28 [V code:
# torch.optim.adamw _single_tensor_adam; DeepSpeed csrc/adam/cpu_adam_impl.cpp]. The ranks share the node's memory.
TORCH_ADAM_BYTES = 80
CPU_ADAM_BYTES = 28
# A server's host memory bandwidth where the node's is not measured [A: two sockets of eight DDR4-3200 channels, 410
# GB/s of peak, about half reached by a copy]
HOST_BANDWIDTH = 200e9
# A training server's cores for each of its GPUs, where the node's are neither this machine's nor given (--host-cores)
# [A: DGX H100 has 112 for 8 GPUs, AWS p4d 48 for 8]
CORES_PER_GPU = 8
DEEPSPEED_LINK_BYTES = 2  # a bf16 gradient down, a bf16 weight up [D: DeepSpeed's offload copies in the engine dtype]
TORCH_LINK_BYTES = 4  # FSDP2's shards keep the loaded dtype, float32 [D: torch fully_shard with CPUOffloadPolicy]
# Saved activations TRL offloads per token and layer: about four hidden-size tensors in bf16 [A]
ACTIVATION_OFFLOAD_TENSORS = 4


def host_terms(candidate: Candidate, card: Card, trainable: float, total: float, passes: int) -> Dict[str, float]:
    """Seconds per optimizer step of the candidate's offload (none for a run that offloads nothing): the optimizer on
    the host, its gradients down and weights up over each rank's own link, and the offloaded weights fetched for
    every pass (forward, backward, checkpointing's recompute) of every micro-batch."""
    offload = host_offload(candidate)
    link = card.host_link * HOST_LINK_EFFICIENCY
    ranks = candidate.ranks
    terms: Dict[str, float] = {}
    if offload.optimizer is not None:
        torch_step = offload.optimizer == "torch"
        element = TORCH_LINK_BYTES if torch_step else DEEPSPEED_LINK_BYTES
        # each rank steps its own shard (trainable / ranks) on its share of the node's cores (cores / ranks), all at
        # once: the step takes the whole count over the node's cores
        # the node's GPUs: the trainer's ranks, and those a vLLM server takes beside them
        gpus = ranks + (candidate.vllm_server_gpus or 0)
        terms["optimizer (host)"] = trainable / host_adam_rate(card, torch_step, gpus)
        # the updated weights go back up only where the device keeps them; offloaded ones are fetched for each pass
        crossings = 1 if offload.parameters else 2
        terms["optimizer (host link)"] = trainable / ranks * element * crossings / link
    if offload.parameters:
        element = TORCH_LINK_BYTES if offload.optimizer == "torch" else DEEPSPEED_LINK_BYTES
        terms["parameter fetches (host link)"] = candidate.grad_accum * passes * total / ranks * element / link
    return terms


def host_adam_per_core(card: Card, torch_step: bool) -> float:
    """Parameters a second one core of the host steps: torch's AdamW (FSDP2's offload) or DeepSpeed's CPUAdam."""
    if torch_step:
        return card.host_torch_adam or TORCH_ADAM_PER_CORE
    return card.host_cpu_adam or CPU_ADAM_PER_CORE


def host_adam_rate(card: Card, torch_step: bool, ranks: int) -> float:
    """The node's parameters a second, all ranks stepping at once: its cores at the rate of one, up to what its memory
    bandwidth moves."""
    moved = TORCH_ADAM_BYTES if torch_step else CPU_ADAM_BYTES
    return min(host_adam_per_core(card, torch_step) * host_cores(card, ranks),
               (card.host_bandwidth or HOST_BANDWIDTH) / moved)


def host_cores(card: Card, gpus: int) -> float:
    """The cores of the node the ranks share: the card's host's, else ``CORES_PER_GPU`` for each of its GPUs."""
    return card.host_cores or CORES_PER_GPU * gpus


def steps_on_host(candidate: Candidate) -> bool:
    """Whether the candidate's optimizer steps on the host (an offloading engine, or the user's DeepSpeed file)."""
    return host_offload(candidate).optimizer is not None


def host_of(card: Card, cores: float, measured: Optional[Dict[str, Any]], threads: int, here: bool) -> Card:
    """``card`` priced on a host of ``cores`` (0: ``CORES_PER_GPU`` a rank) at the rates ``autofit.probe._host_adam``
    measured on ``threads`` (None: not measured, the assumed rates), with where the rates come from; the memory
    bandwidth measured is the node's where it trains ``here``, else a server's is assumed."""
    if measured is None:
        return replace(card, host_cores=cores, host_source="assumed rates: not measured here")
    torch_rate, cpu_adam = float(measured["torch"]), measured.get("deepspeed")
    cpu_rate = float(cpu_adam) if isinstance(cpu_adam, (int, float)) else 0.0
    built = cpu_rate > 0
    ratio = CPU_ADAM_PER_CORE / TORCH_ADAM_PER_CORE  # DeepSpeed's CPUAdam not timed: torch's at this ratio
    source = "measured here on one thread" if threads == 1 else f"measured here, {threads} threads"
    source += "" if built else f", DeepSpeed's CPUAdam as torch's x{ratio:.1f} (not timed)"
    bandwidth = float(measured.get("bandwidth") or 0) if here else 0.0
    return replace(card, host_torch_adam=torch_rate, host_cpu_adam=cpu_rate if built else torch_rate * ratio,
                   host_cores=cores, host_bandwidth=bandwidth, host_source=source)


def host_figures(card: Card, ranks: int) -> Dict[str, Any]:
    """What an offloaded optimizer step is priced at: each AdamW's parameters a second a core, the node's cores
    (``cores_assumed``: ``CORES_PER_GPU`` a rank) and where the rates come from."""
    return {"torch_adam_per_core": host_adam_per_core(card, True), "cpu_adam_per_core": host_adam_per_core(card, False),
            "cores": host_cores(card, ranks), "cores_assumed": not card.host_cores,
            "bandwidth": card.host_bandwidth or HOST_BANDWIDTH, "bandwidth_assumed": not card.host_bandwidth,
            "torch_adam_node": host_adam_rate(card, True, ranks), "cpu_adam_node": host_adam_rate(card, False, ranks),
            "source": card.host_source or "assumed rates"}


def host_line(card: Card, ranks: int) -> str:
    """``host_figures`` for the estimate's text."""
    figures = host_figures(card, ranks)
    assumed = f" ({CORES_PER_GPU} a GPU, assumed: --host-cores N for the training machine's)"
    memory = f"{figures['bandwidth'] / 1e9:,.0f} GB/s of host memory" + (
        " (a server's, assumed)" if figures["bandwidth_assumed"] else " (measured here)")
    return (f"host optimizer step: torch's AdamW {figures['torch_adam_per_core'] / 1e6:,.0f}M and DeepSpeed's "
            f"CPUAdam {figures['cpu_adam_per_core'] / 1e6:,.0f}M parameters/s a core ({figures['source']}), on "
            f"{figures['cores']:g} cores" + (assumed if figures["cores_assumed"] else "") + f" and {memory}: "
            f"{figures['torch_adam_node'] / 1e9:,.2f}e9 and {figures['cpu_adam_node'] / 1e9:,.2f}e9 a second")


def activation_offload_seconds(candidate: Candidate, card: Card, rows: float, layers: int, hidden: int,
                               forward: float, backward: float) -> float:
    """What TRL's activation offloading adds to a step: its copies run on a second CUDA stream beside the compute
    [V code: trl 1.16 models/activation_offloading.py, ``OffloadActivations(use_streams=True)``], so only the part
    that outruns the forward (the copies out) and the backward (the copies back) waits. ``forward`` and ``backward``:
    one micro-batch's compute seconds of each."""
    if not activation_policy(candidate).offloads_activations:
        return 0.0
    saved = rows * layers * hidden * 2 * ACTIVATION_OFFLOAD_TENSORS
    copy = saved / (card.host_link * HOST_LINK_EFFICIENCY)
    if card.cpu:  # no second stream: the copies wait in line
        return candidate.grad_accum * 2 * copy
    return candidate.grad_accum * (max(0.0, copy - forward) + max(0.0, copy - backward))
