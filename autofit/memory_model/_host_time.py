"""What a step spends on the host and on the link to it (issue 48): the optimizer step an offloading engine runs on
the CPU, the gradients and weights it moves over PCIe, the weights ZeRO-3's and FSDP2's parameter offload fetch for
every pass, and activation offloading's copies where they outrun the compute they overlap.

One term for every door: autofit's optimizer-offload rung, its offloading shardings, and a DeepSpeed configuration of
the user's that offloads (``_engine_settings.host_offload`` reads all three) are the same engine and get the same time.
"""

from __future__ import annotations

from typing import Dict

from autofit.core import Candidate, Card
from autofit.memory_model._engine_settings import host_offload

HOST_LINK_EFFICIENCY = 0.80  # [M: pinned host copies reach about 25 of PCIe 4's 32 GB/s]
# DeepSpeed's CPU Adam updates about 1e9 parameters a second on a server's cores [A: ZeRO-Offload (Ren et al. 2021)
# reports its CPU Adam 5-7x faster than PyTorch's on the host; no single rate is published for every machine]. The
# machine's cores step every rank's partition, so the step takes the whole trainable count at this rate.
HOST_ADAM_PARAMS_PER_SECOND = 1e9
# FSDP2's CPU offload steps with the Trainer's own optimizer, torch's AdamW on the host: the same paper's 5x, its
# low end [A]
TORCH_HOST_ADAM_PARAMS_PER_SECOND = HOST_ADAM_PARAMS_PER_SECOND / 5
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
        rate = TORCH_HOST_ADAM_PARAMS_PER_SECOND if torch_step else HOST_ADAM_PARAMS_PER_SECOND
        element = TORCH_LINK_BYTES if torch_step else DEEPSPEED_LINK_BYTES
        terms["optimizer (host)"] = trainable / rate
        # the updated weights go back up only where the device keeps them; offloaded ones are fetched for each pass
        crossings = 1 if offload.parameters else 2
        terms["optimizer (host link)"] = trainable / ranks * element * crossings / link
    if offload.parameters:
        element = TORCH_LINK_BYTES if offload.optimizer == "torch" else DEEPSPEED_LINK_BYTES
        terms["parameter fetches (host link)"] = candidate.grad_accum * passes * total / ranks * element / link
    return terms


def activation_offload_seconds(candidate: Candidate, card: Card, rows: float, layers: int, hidden: int,
                               forward: float, backward: float) -> float:
    """What TRL's activation offloading adds to a step: its copies run on a second CUDA stream beside the compute
    [V code: trl 1.16 models/activation_offloading.py, ``OffloadActivations(use_streams=True)``], so only the part
    that outruns the forward (the copies out) and the backward (the copies back) waits. ``forward`` and ``backward``:
    one micro-batch's compute seconds of each."""
    if not candidate.activation_offload:
        return 0.0
    saved = rows * layers * hidden * 2 * ACTIVATION_OFFLOAD_TENSORS
    copy = saved / (card.host_link * HOST_LINK_EFFICIENCY)
    if card.cpu:  # no second stream: the copies wait in line
        return candidate.grad_accum * 2 * copy
    return candidate.grad_accum * (max(0.0, copy - forward) + max(0.0, copy - backward))
