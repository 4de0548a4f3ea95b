"""What ``autofit estimate`` and a search's notes say of a colocated or served vLLM (``autofit.memory_model._vllm``
has the arithmetic): the first line whether it starts and what its cache holds, then one line per term of its
accounting, what it spends beyond its share, and whether the card has its share free at its start."""

from __future__ import annotations

import math
from typing import List, Sequence

from autofit.core import Candidate, SearchSpec, format_size
from autofit.memory_model._allocator import context_bytes
from autofit.memory_model._levels import base_candidate
from autofit.memory_model._parameters import state_bytes
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._vllm import (
    TRL_MAX_NUM_BATCHED_TOKENS,
    VllmShare,
    beyond_share,
    candidate_share,
    capture_sizes,
    vllm_asleep_bytes,
)
from autofit.memory_model._vllm_recorded import RECORDS, UNMODELLED_BAND

TERM = "vllm:   "  # a term of the share, under its first line


def free_at_start(candidate: Candidate, shape: ModelShape, gpu_bytes: int) -> float:
    """What the card has free when TRL starts a colocated vLLM: the trainer has loaded its model (and its reference
    model) by then, and the CUDA context is up. vLLM refuses to start with less free than its whole share
    [S: vllm/v1/worker/utils.py, request_memory: "Free memory on device ... is less than desired GPU memory
    utilization"]."""
    state = state_bytes(candidate, shape, "cuda")
    return gpu_bytes - context_bytes("cuda") - state.weights - state.reference


def _sizes(sizes: Sequence[int]) -> str:
    shown = [str(size) for size in sizes]
    return ", ".join(shown if len(shown) <= 6 else shown[:4] + ["...", shown[-1]])


def _recorded(name: str) -> str:
    values = sorted(record.figures[name] for record in RECORDS if name in record.figures)
    return f"{values[0]:.2f}-{values[-1]:.2f} GiB" if values else "none"


def term_lines(share: VllmShare, device: str = "cuda") -> List[str]:
    """One line per term of vLLM's share, each as vLLM's own log names it (``device`` "cpu": the CPU build's, which
    has no CUDA graphs, no non-torch memory and spends nothing beyond its share on a card)."""
    piecewise, full = share.graphs
    kv = (f"KV cache {format_size(share.kv_cache)}, what the share leaves = "
          f"{int(share.kv_cache // share.kv_per_token):,} tokens" if share.kv_cache > 0 else
          f"KV cache: nothing left ({format_size(share.kv_cache)})")
    lines = [
        f"{TERM}weights {format_size(share.weights)} ({share.weight_format}; its log: \"Model loading took\")",
        f"{TERM}profiling peak {format_size(share.profile_peak)}: one forward of TRL's max_num_batched_tokens "
        f"{TRL_MAX_NUM_BATCHED_TOKENS} and the sampler's logits of {share.max_num_seqs} sequences (\"PyTorch "
        "activation peak\")",
        f"{TERM}non-torch memory {format_size(share.non_torch)}: cuBLAS/cuDNN workspaces, NCCL buffers of its own "
        f"(\"non_torch_memory\", recorded {_recorded('non_torch')}; the CUDA context is the trainer's)",
        f"{TERM}CUDA graphs {format_size(share.cuda_graphs)}: {piecewise} piecewise + {full} full for capture sizes "
        f"{_sizes(capture_sizes(share.max_num_seqs))} (TRL's max_num_seqs {share.max_num_seqs}, no enforce_eager; "
        "counted before the KV cache since vLLM 0.21: \"Estimated CUDA graph memory\")",
        f"{TERM}{kv}; to start it needs one max_model_len sequence, {share.max_model_len:,} tokens = "
        f"{format_size(share.start_tokens * share.kv_per_token)} (\"Available KV cache memory\")",
        f"{TERM}beyond its share, {format_size(UNMODELLED_BAND[0])} to {format_size(UNMODELLED_BAND[1])} its "
        "accounting misses (the real graph capture after the cache is allocated, its own 150 MiB margin): held at "
        f"{format_size(UNMODELLED_BAND[1])}, so a level that leaves less of the card free is not called a fit",
    ]
    if device != "cuda":  # the simulated device: vLLM's CPU build
        return [lines[0], lines[1], lines[4]]
    return lines


def vllm_lines(spec: SearchSpec, shape: ModelShape) -> List[str]:
    """What vLLM's share of each GPU holds (``candidate_share`` of the run as launched: its batch, its steps per
    generation, the file's ``vllm_max_model_length``), and whether it starts and holds TRL's batch."""
    options = spec.options
    if options.use_vllm is None:
        return []
    if options.use_vllm == "server":
        return ["vllm: server mode: vLLM runs on other GPUs (trl vllm-serve), the trainer has the whole budget and "
                "does not generate; size the server's GPUs with its own --gpu-memory-utilization"]
    assert spec.gpu_bytes is not None, "a colocated vLLM takes a share of a known GPU memory"
    candidate = base_candidate(spec)
    utilization = candidate.vllm_utilization or options.vllm_gpu_memory_utilization
    share = candidate_share(candidate.replace(vllm_share_bytes=int(utilization * spec.gpu_bytes)), shape)
    tokens_per_sequence = (candidate.prompt_length or 0) + candidate.max_length
    head = f"vllm: colocate, {utilization:.0%} of each GPU ({format_size(share.share)}): "
    if not share.starts:
        need = math.ceil(100 * share.start_need / spec.gpu_bytes) / 100  # up: "at least" is a share that starts it
        why = (f"its weights, profiling peak, non-torch memory and CUDA graphs alone take {format_size(share.fixed)}"
               if share.fixed >= share.share else f"what its fixed terms leave, {format_size(share.kv_cache)}, is less")
        context = "" if candidate.vllm_max_model_length else "set vllm_max_model_length, "
        first = (head + f"no room for a KV cache of one {share.max_model_len}-token sequence "
                 f"({format_size(share.start_tokens * share.kv_per_token)}; {why}): vLLM will not start. "
                 + (f"Raise --vllm-gpu-memory-utilization to at least {need:.2f} (the trainer then has the rest), "
                    if need <= 1 else "No share of this card holds it: ")
                 + f"{context}or use server mode (the vllm-context and vllm-share rungs size both)")
    else:
        batch = (f"it holds TRL's {share.max_num_seqs} sequences of {tokens_per_sequence} tokens at once"
                 if share.holds_the_batch else
                 f"TRL's {share.max_num_seqs} sequences of {tokens_per_sequence} tokens need "
                 f"{share.batch_tokens:,}: vLLM queues the rest (slower generation, no error)")
        first = head + f"it starts, KV cache {format_size(share.kv_cache)}; {batch}"
    free = free_at_start(candidate, shape, spec.gpu_bytes)
    if free < share.share:
        start = (f"vllm: at its start the trainer's model is loaded and {format_size(max(free, 0))} of the card is "
                 f"free, less than the {format_size(share.share)} vLLM asks: it refuses to start (\"Free memory on "
                 f"device ... is less than desired GPU memory utilization\"); a smaller share, a smaller trainer "
                 "(LoRA, a quantized base, sharding) or server mode")
    else:
        start = (f"vllm: at its start {format_size(free)} of the card is free (the trainer's model loaded, the CUDA "
                 f"context up), at least the {format_size(share.share)} it asks: the start check passes")
    trainer = spec.gpu_bytes - share.share - beyond_share(spec.device)
    rest = (f"vllm: the trainer has the rest, {format_size(trainer)} per "
            "GPU, and no generation phase of its own; the share and what vLLM spends beyond it are the generation "
            "column of every level")
    return [first, *term_lines(share, spec.device), start, rest]



def level_vllm_line(candidate: Candidate, shape: ModelShape, peak: float, budget: int) -> str:
    """What a level's colocated vLLM holds, term by term, and what the card keeps beside the level's peak (empty
    without a colocated share)."""
    if candidate.vllm != "colocate" or not candidate.vllm_share_bytes:
        return ""
    share = candidate_share(candidate, shape)
    kv = (f"KV cache {format_size(max(share.kv_cache, 0.0))} ({int(max(share.kv_cache, 0.0) // share.kv_per_token):,} "
          f"tokens, {'holds' if share.holds_the_batch else 'queues'} TRL's {share.max_num_seqs} sequences)")
    return (f"vllm at this level: {candidate.vllm_utilization or 0:.0%} of each GPU ({format_size(share.share)}) = "
            f"weights {format_size(share.weights)} + profiling peak {format_size(share.profile_peak)} + non-torch "
            f"{format_size(share.non_torch)} + CUDA graphs {format_size(share.cuda_graphs)} + {kv}; "
            f"{format_size(beyond_share(candidate.device))} beyond it held in the peak, and the card keeps "
            f"{format_size(budget - peak)} free besides"
            + (f"; asleep outside generation (sleep level 2), it keeps "
               f"{format_size(vllm_asleep_bytes(candidate, shape))} while the trainer trains, nothing in host memory"
               if candidate.vllm_sleep and candidate.device == "cuda" else ""))
