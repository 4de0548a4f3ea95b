"""vLLM generating for GRPO/RLOO (``use_vllm``): its share of each GPU, from vLLM's own memory accounting.

vLLM V1 (0.22-0.31, the versions TRL 1.16 accepts) sizes its KV cache at its start as what its share leaves
[S: vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory; vllm/v1/worker/utils.py, request_memory;
vllm/utils/mem_utils.py, memory_profiling]:

    requested = ceil(total x gpu_memory_utilization)           # refused at start if the card has less free
    KV cache  = requested - weights - torch peak of the profile run - non-torch increase - CUDA-graph estimate

where the profile run is one forward of ``max_num_batched_tokens`` tokens with the sampler, the non-torch increase is
what the process allocated outside PyTorch since vLLM's start snapshot (cuBLAS/cuDNN workspaces, NCCL's buffers of its
own groups), and the CUDA-graph estimate (applied by default since v0.21, ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``)
is the memory of the graphs it captures for its capture sizes. It refuses to start when the cache cannot hold one
``max_model_len`` sequence [S: vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory] and queues sequences
(slower, never an out-of-memory error) when it cannot hold the batch's. TRL 1.16 (``generation/vllm_generation.py``,
``VLLMGeneration``) starts it with ``max_num_seqs`` = per-device batch x tensor parallel x ``steps_per_generation``,
``max_num_batched_tokens`` = 4096, ``max_model_len`` = ``vllm_max_model_length`` (None: the model's
``max_position_embeddings``), and neither ``enforce_eager`` nor a compilation config: CUDA graphs are captured.

``colocate``: vLLM runs in each training process and reserves its share at its start, so the share is a term of every
phase of the candidate's ledger (``vllm_term``: the generation column), with what vLLM spends beyond it that its
accounting misses (``UNMODELLED_BAND``, held at its high end: a level that leaves less free is not called a fit);
the trainer has the rest and does not generate with transformers. ``server``: vLLM runs on other GPUs
(``trl vllm-serve``); the trainer has the whole GPU and no generation phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

from autofit.core import DEFAULT_ALGO, Candidate
from autofit.memory_model._parameters import NF4_PLAIN_BYTES_PER_PARAM, param_counts
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._vllm_recorded import GRAPH_BYTES_PER_CAPTURE, NON_TORCH_BYTES, UNMODELLED_BAND

VLLM_MODES = ("colocate", "server")
TRL_DEFAULT_UTILIZATION = 0.3  # GRPOConfig.vllm_gpu_memory_utilization
# [S: trl/generation/vllm_generation.py, VLLMGeneration: LLM(max_num_batched_tokens=4096)]
TRL_MAX_NUM_BATCHED_TOKENS = 4096
VLLM_WEIGHT_BYTES = 2  # bf16
KV_BYTES = 2  # bf16 cache
# The profiling run's peak per batched token: the MLP's gate/up output (2 x intermediate) and its activation's output
# (1 x intermediate), live together in bf16 [S: vllm/model_executor/layers/activation.py, SiluAndMul.forward_cuda:
# the output is allocated beside its input], and a few hidden-size tensors in bf16 [A]; the sampler's fp32 logits for
# every sequence [S: vllm/v1/worker/gpu_model_runner.py, profile_run: _dummy_run of max_num_tokens, then
# _dummy_sampler_run]. Held to vLLM's "PyTorch activation peak memory" of a known model in the tests.
PROFILE_BYTES_PER_TOKEN_I, PROFILE_BYTES_PER_TOKEN_H = 3 * 2, 4 * 2
SAMPLER_LOGIT_BYTES = 4
MAX_CAPTURE_SIZE = 512  # [S: vllm/config/vllm.py, VllmConfig._set_cudagraph_sizes: min(max_num_seqs * 2, 512)]


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int = TRL_MAX_NUM_BATCHED_TOKENS) -> List[int]:
    """The batch sizes vLLM captures CUDA graphs for, unset by the user (TRL sets none) [S: vllm/config/vllm.py,
    VllmConfig._set_cudagraph_sizes]: 1, 2, 4, then every 8 below 256, every 16 from 256, up to
    min(2 x max_num_seqs, 512, max_num_batched_tokens)."""
    largest = min(2 * max_num_seqs, MAX_CAPTURE_SIZE, max_num_batched_tokens)
    sizes = [size for size in (1, 2, 4) if size <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
    return sizes


def graph_counts(max_num_seqs: int) -> Tuple[int, int]:
    """(PIECEWISE, FULL) graphs vLLM captures under its default ``cudagraph_mode`` FULL_AND_PIECEWISE
    [S: vllm/config/compilation.py, CompilationConfig.cudagraph_mode]: a piecewise graph for every capture size (mixed
    prefill-decode batches) and a full one for every decode size up to ``max_num_seqs`` (its log: "Profiling CUDA
    graph memory: PIECEWISE=51 (largest=512), FULL=35 (largest=256)" at 256 sequences)."""
    sizes = capture_sizes(max_num_seqs)
    return len(sizes), len([size for size in sizes if size <= max_num_seqs])


@dataclass(frozen=True)
class VllmShare:
    share: float  # bytes vLLM takes of the GPU (colocate): ceil(total x utilization)
    weights: float
    profile_peak: float
    non_torch: float
    cuda_graphs: float
    graphs: Tuple[int, int]  # (PIECEWISE, FULL) graphs captured
    kv_cache: float  # what is left for the KV cache (negative: nothing)
    kv_per_token: float
    max_model_len: int
    max_num_seqs: int
    start_tokens: int  # the KV cache vLLM needs to start: one sequence of max_model_len
    batch_tokens: int  # what TRL's batch needs at once: max_num_seqs sequences of prompt + completion
    weight_format: str = "bf16"

    @property
    def fixed(self) -> float:
        """Everything of the share but the KV cache."""
        return self.weights + self.profile_peak + self.non_torch + self.cuda_graphs

    @property
    def starts(self) -> bool:
        return self.kv_cache >= self.start_tokens * self.kv_per_token

    @property
    def holds_the_batch(self) -> bool:
        return self.kv_cache >= self.batch_tokens * self.kv_per_token

    @property
    def start_need(self) -> float:
        """What the share must hold for vLLM to start: all but the cache, and one max_model_len sequence of it."""
        return self.fixed + self.start_tokens * self.kv_per_token


@dataclass(frozen=True)
class VllmMeasured:
    """vLLM's own figures for its share, where a log gives them (``_vllm_recorded.parse_log``), in bytes: each one
    given replaces the ledger's term."""

    weights: Optional[float] = None
    profile_peak: Optional[float] = None
    non_torch: Optional[float] = None
    cuda_graphs: Optional[float] = None


def vllm_share(shape: ModelShape, budget_bytes: int, utilization: float, max_num_seqs: int, sequence_tokens: int,
               max_model_len: Optional[int] = None, algo: str = DEFAULT_ALGO,
               measured: VllmMeasured = VllmMeasured(), on_gpu: bool = True, four_bit: bool = False) -> VllmShare:
    """vLLM's colocated share of one GPU of ``budget_bytes`` (tensor parallel 1). ``on_gpu`` False: the simulated
    device's, vLLM's CPU build, which captures no CUDA graphs and allocates nothing outside PyTorch on a card.
    ``four_bit``: the trainer's base is bitsandbytes 4-bit, and TRL starts vLLM with ``quantization="bitsandbytes"``
    (in-flight NF4 of the linear layers) [S: trl/generation/vllm_generation.py, VLLMGeneration: a Linear4bit in the
    model sets it; a Linear8bitLt raises "vLLM does not support in-flight 8-bit quantization."]."""
    share = float(math.ceil(utilization * budget_bytes))
    counts = param_counts(shape, algo)
    weights = float(counts.total * VLLM_WEIGHT_BYTES)
    if four_bit:  # NF4 without nested quantization, the larger of bitsandbytes' two: vLLM's own settings are not read
        weights = counts.linear * NF4_PLAIN_BYTES_PER_PARAM + (counts.total - counts.linear) * VLLM_WEIGHT_BYTES
    profile = profile_peak(shape, TRL_MAX_NUM_BATCHED_TOKENS, max_num_seqs)
    graphs = graph_counts(max_num_seqs) if on_gpu else (0, 0)
    terms = {"weights": float(weights), "profile_peak": float(profile), "non_torch": NON_TORCH_BYTES if on_gpu else 0.0,
             "cuda_graphs": sum(graphs) * GRAPH_BYTES_PER_CAPTURE}
    terms.update({name: float(value) for name, value in vars(measured).items() if value is not None})
    kv_per_token = 2 * shape.layers * shape.kv_dim * KV_BYTES  # K and V of every layer
    model_len = max_model_len or shape.max_positions or sequence_tokens
    return VllmShare(share=share, **terms, graphs=graphs, kv_cache=share - sum(terms.values()),
                     kv_per_token=kv_per_token, max_model_len=model_len, max_num_seqs=max_num_seqs,
                     start_tokens=model_len, batch_tokens=max_num_seqs * sequence_tokens,
                     weight_format="NF4 linear layers, the rest bf16" if four_bit else "bf16")


def profile_peak(shape: ModelShape, batched_tokens: int, sequences: int, tensor_parallel: int = 1) -> float:
    """The torch peak of vLLM's profile run: one forward of ``batched_tokens`` tokens (the MLP's intermediate split
    over ``tensor_parallel`` GPUs, the hidden-size tensors whole) and the sampler's logits of ``sequences``."""
    return float(batched_tokens * (PROFILE_BYTES_PER_TOKEN_I * shape.intermediate / tensor_parallel
                                   + PROFILE_BYTES_PER_TOKEN_H * shape.hidden)
                 + sequences * shape.vocab * SAMPLER_LOGIT_BYTES)


def max_num_seqs(candidate: Candidate) -> int:
    """TRL's ``max_num_seqs``: per-device batch x vLLM's tensor parallel size x ``steps_per_generation`` (the
    accumulation steps unless set) [S: trl/trainer/grpo_trainer.py, GRPOTrainer.__init__: VLLMGeneration(...)]."""
    args = dict(candidate.user_args)
    steps = int(args.get("steps_per_generation") or candidate.grad_accum)
    return candidate.micro_batch * int(args.get("vllm_tensor_parallel_size") or 1) * steps


def candidate_share(candidate: Candidate, shape: ModelShape) -> VllmShare:
    """vLLM's share of one GPU as the candidate runs it: its reserved bytes, TRL's ``max_num_seqs``, its context."""
    return vllm_share(shape, candidate.vllm_share_bytes or 0, 1.0, max_num_seqs=max_num_seqs(candidate),
                      sequence_tokens=(candidate.prompt_length or 0) + candidate.max_length,
                      max_model_len=candidate.vllm_max_model_length, algo=candidate.algo,
                      on_gpu=candidate.device == "cuda", four_bit=candidate.quantization == "4bit")


def vllm_need(candidate: Candidate, shape: ModelShape) -> float:
    """The bytes vLLM needs of its share to start and to hold TRL's batch at once: its weights, its profiling peak, its
    non-torch memory and CUDA graphs, and a KV cache of one max_model_len sequence or of the batch, whichever is
    larger."""
    share = candidate_share(candidate, shape)
    return share.fixed + max(share.start_tokens, share.batch_tokens) * share.kv_per_token


def vllm_term(candidate: Candidate, shape: ModelShape) -> float:
    """What a colocated vLLM holds of the card in every phase of the step: its share, reserved at its start (where the
    share cannot start it, what it would need, so that such a candidate is never predicted to fit), and what it spends
    beyond its share that its accounting misses (the high end of ``UNMODELLED_BAND``; on a GPU only: the simulated
    device's share is a block its probes reserve)."""
    if candidate.vllm != "colocate" or not candidate.vllm_share_bytes:
        return 0.0
    share = candidate_share(candidate, shape)
    return float(max(candidate.vllm_share_bytes, share.start_need)) + beyond_share(candidate.device)


def vllm_asleep_bytes(candidate: Candidate, shape: ModelShape) -> float:
    """What a colocated vLLM keeps of the card asleep at level 2 (TRL's sleep mode): its weights and KV cache are
    released (CuMemAllocator's tagged pools), its non-torch memory and CUDA graphs are not [S: vllm/device_allocator/
    cumem.py, CuMemAllocator.sleep; its log: "Sleep mode freed X GiB memory, Y GiB memory is still in use"], nor what
    it spends beyond its share."""
    share = candidate_share(candidate, shape)
    return share.non_torch + share.cuda_graphs + beyond_share(candidate.device)


def vllm_weight_bytes(candidate: Candidate, shape: ModelShape) -> float:
    """vLLM's weights in its share (bf16, or NF4 linear layers under a 4-bit base)."""
    return candidate_share(candidate, shape).weights


def vllm_refusal(candidate: Candidate, shape: ModelShape) -> str:
    """Why a colocated vLLM does not start at the candidate's share on a GPU (no KV cache for one max_model_len
    sequence: "To serve at least one request with the models's max seq len ...", [S: vllm/v1/core/kv_cache_utils.py,
    check_enough_kv_cache_memory]), whatever the card has beside it; "" where it starts. The CPU build sizes its
    cache by ``VLLM_CPU_KVCACHE_SPACE`` in host memory, not by the share: never refused on the simulated device."""
    if candidate.vllm != "colocate" or not candidate.vllm_share_bytes or candidate.device != "cuda":
        return ""
    share = candidate_share(candidate, shape)
    if share.starts:
        return ""
    return (f"vLLM does not start at {candidate.vllm_utilization or 0:.0%} of the card: its share leaves no KV cache "
            f"for one {share.max_model_len}-token sequence")


def beyond_share(device: str) -> float:
    """What a colocated vLLM spends beyond its share that its accounting misses, as the ledger holds it."""
    return float(UNMODELLED_BAND[1]) if device == "cuda" else 0.0


# ``trl vllm-serve``'s own settings [S: trl/scripts/vllm_serve.py, ScriptArguments: gpu_memory_utilization 0.9,
# no enforce_eager; data parallel 1], and vLLM's server defaults it leaves unset [A: vLLM's engine defaults for its
# OpenAI server, EngineArgs._set_default_args: max_num_seqs 256, max_num_batched_tokens 2048 (8192 from 70 GiB);
# recalled, not read in this tree]
SERVER_UTILIZATION = 0.9
SERVER_MAX_NUM_SEQS = 256
SERVER_BATCHED_TOKENS = (2048, 8192)
LARGE_CARD_BYTES = 70 * 2**30


def server_share(candidate: Candidate, shape: ModelShape, gpu_bytes: int, gpus: int) -> Optional[VllmShare]:
    """What ``trl vllm-serve`` holds of each of its ``gpus`` GPUs (tensor parallel ``gpus``) serving the candidate's
    model, bf16, for the whole generation batch of the trainer's ranks at once; None where vLLM does not take that
    tensor parallel size for the model: the attention heads split evenly, and the KV heads split or are replicated
    [S: vllm/config/model.py, ModelConfig.verify_with_parallel_config; vllm/model_executor/layers/linear.py,
    QKVParallelLinear]."""
    if shape.heads % gpus or (shape.kv_heads % gpus and gpus % shape.kv_heads):
        return None
    counts = param_counts(shape, candidate.algo)
    batched = SERVER_BATCHED_TOKENS[gpu_bytes >= LARGE_CARD_BYTES]
    graphs = graph_counts(SERVER_MAX_NUM_SEQS) if candidate.device == "cuda" else (0, 0)
    kv_heads_here = max(shape.kv_heads // gpus, 1)
    kv_per_token = 2 * shape.layers * kv_heads_here * shape.head_dim * KV_BYTES
    share = float(math.ceil(SERVER_UTILIZATION * gpu_bytes))
    weights = counts.total * VLLM_WEIGHT_BYTES / gpus
    profile = profile_peak(shape, batched, SERVER_MAX_NUM_SEQS, tensor_parallel=gpus)
    non_torch = NON_TORCH_BYTES if candidate.device == "cuda" else 0.0
    cuda_graphs = float(sum(graphs) * GRAPH_BYTES_PER_CAPTURE)
    sequence = (candidate.prompt_length or 0) + candidate.max_length
    model_len = candidate.vllm_max_model_length or shape.max_positions or sequence
    sequences = candidate.micro_batch * candidate.grad_accum * candidate.ranks  # every rank's, sent at once
    return VllmShare(share=share, weights=weights, profile_peak=profile, non_torch=non_torch, cuda_graphs=cuda_graphs,
                     graphs=graphs, kv_cache=share - weights - profile - non_torch - cuda_graphs,
                     kv_per_token=kv_per_token, max_model_len=model_len,
                     max_num_seqs=SERVER_MAX_NUM_SEQS, start_tokens=model_len,
                     batch_tokens=min(sequences, SERVER_MAX_NUM_SEQS) * sequence)


def server_fits(candidate: Candidate, shape: ModelShape, gpu_bytes: int, gpus: int) -> bool:
    """Whether ``trl vllm-serve`` on ``gpus`` GPUs of ``gpu_bytes`` starts and holds the trainer's batch at once."""
    share = server_share(candidate, shape, gpu_bytes, gpus)
    return share is not None and share.starts and share.holds_the_batch


def equivalent_utilization(utilization: float, cuda_graphs: float, total_bytes: float) -> float:
    """The share without the CUDA-graph estimate, as vLLM's log says it ("The current --gpu-memory-utilization=U is
    equivalent to --gpu-memory-utilization=E without CUDA graph memory profiling") [S: vllm/v1/worker/gpu_worker.py,
    Worker.determine_available_memory]."""
    return round(utilization - cuda_graphs / total_bytes, 4)
