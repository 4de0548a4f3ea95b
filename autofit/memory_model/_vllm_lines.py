"""What ``autofit estimate`` and a search's notes say of a colocated or served vLLM (``autofit.memory_model._vllm``
has the arithmetic): whether it starts, what its cache holds, and whether the card has its share free at its start."""

from __future__ import annotations

from typing import List

from autofit.core import Candidate, SearchSpec, format_size
from autofit.memory_model._allocator import context_bytes
from autofit.memory_model._levels import base_candidate
from autofit.memory_model._parameters import state_bytes
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._vllm import vllm_share


def free_at_start(candidate: Candidate, shape: ModelShape, gpu_bytes: int) -> float:
    """What the card has free when TRL starts a colocated vLLM: the trainer has loaded its model (and its reference
    model) by then, and the CUDA context is up. vLLM refuses to start with less free than its whole share ("Free
    memory on device ... is less than desired GPU memory utilization")."""
    state = state_bytes(candidate, shape, "cuda")
    return gpu_bytes - context_bytes("cuda") - state.weights - state.reference


def vllm_lines(spec: SearchSpec, shape: ModelShape) -> List[str]:
    """What vLLM's share of each GPU holds (``vllm_share``), and whether it starts and holds TRL's batch."""
    options = spec.options
    if options.use_vllm is None:
        return []
    if options.use_vllm == "server":
        return ["vllm: server mode: vLLM runs on other GPUs (trl vllm-serve), the trainer has the whole budget and "
                "does not generate; size the server's GPUs with its own --gpu-memory-utilization"]
    per_rank, utilization = spec.rank_batch, options.vllm_gpu_memory_utilization
    assert spec.gpu_bytes is not None, "a colocated vLLM takes a share of a known GPU memory"
    tokens_per_sequence = options.max_prompt_length + spec.max_length
    share = vllm_share(shape, spec.gpu_bytes, utilization, max_num_seqs=per_rank,
                       sequence_tokens=tokens_per_sequence, algo=options.algo)
    head = (f"vllm: colocate, {utilization:.0%} of each GPU ({format_size(share.share)}): weights "
            f"{format_size(share.weights)} (bf16) + profiling peak {format_size(share.profile_peak)}; ")
    free = free_at_start(base_candidate(spec), shape, spec.gpu_bytes)
    start = []
    if free < share.share:
        start = [f"vllm: at its start the trainer's model is loaded and {format_size(max(free, 0))} of the card is "
                 f"free, less than the {format_size(share.share)} vLLM asks: it refuses to start (\"Free memory on "
                 f"device ... is less than desired GPU memory utilization\"); a smaller share, a smaller trainer "
                 "(LoRA, a quantized base, sharding) or server mode"]
    if share.kv_cache <= 0 or not share.starts:
        need = (share.weights + share.profile_peak + share.start_tokens * share.kv_per_token) / spec.gpu_bytes
        return [head + f"no room for a KV cache of one {share.max_model_len}-token sequence: vLLM will not start. "
                f"Raise --vllm-gpu-memory-utilization to at least {need:.2f} (the trainer then has the rest), set "
                "vllm_max_model_length, or use server mode (the vllm-context and vllm-share rungs size both)"] + start
    tokens = int(share.kv_cache // share.kv_per_token)
    batch = (f"it holds TRL's {per_rank} sequences of {tokens_per_sequence} tokens at once"
             if share.holds_the_batch else
             f"TRL's {per_rank} sequences of {tokens_per_sequence} tokens need "
             f"{share.batch_tokens:,}: vLLM queues the rest (slower generation, no error)")
    return [head + f"KV cache {format_size(share.kv_cache)} = {tokens:,} tokens; {batch}",
            f"vllm: the trainer has the rest, {format_size(spec.gpu_bytes - share.share)} per GPU, and no generation "
            "phase of its own; the share is the generation column of every level"] + start
