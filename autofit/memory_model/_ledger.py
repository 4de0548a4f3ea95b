"""The ledger: bytes live at each phase of a training step, by term, and the predicted peak.

The peak is the largest of these phases:

- ``train``: the LM head's backward in a micro-batch (weights, optimizer states from the previous step, gradients
  when ``grad_accum >= 2`` because the 2nd micro-batch runs while they are resident, every saved activation, the
  LM-head buffers);
- ``backward``: a decoder layer's backward (its gradient temporaries, or the recomputed layer with checkpointing);
- ``step``: the end of the backward and the optimizer step (weights, gradients, optimizer states, temporaries);
- ``generation`` (grpo, rloo): the completions of the whole generation batch (KV cache, per-step logits).

PPO's update has phases of its own (``_rollout``): generation, scoring, then train, backward and step over the
policy and its value model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional

from autofit.core import PRECOMPUTE, Candidate
from autofit.memory_model._activations import activation_bytes
from autofit.memory_model._allocator import context_bytes, reserved_factor
from autofit.memory_model._checked import CHECKED_UNCERTAINTY, UNCHECKED_UNCERTAINTY, prior_uncertainty, unmodelled
from autofit.memory_model._engine_settings import as_launched, nccl_bytes, shards_parameters, zero_engine
from autofit.memory_model._logits import generation_bytes, logit_bytes
from autofit.memory_model._offload import engine_setup_bytes, gradient_transient_bytes, offloaded_state_bytes
from autofit.memory_model._parameters import compute_bytes, state_bytes, weight_bytes
from autofit.memory_model._rollout import rollout_phases
from autofit.memory_model._rungs import rung_host_bytes, unmodelled_rungs, widest_band, with_rungs
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._sharding import sharded_state, zero_phase_buffers
from autofit.memory_model._vllm import vllm_asleep_bytes, vllm_refusal, vllm_term, vllm_weight_bytes

# The error band of an uncalibrated prediction for a checked family: the activation coefficient alone spans
# 8..16 B·h (2.4) and the logits/loss costs are version-dependent (2.5) [A]. Unchecked families: ``checked``.
PRIOR_UNCERTAINTY = CHECKED_UNCERTAINTY

STATIC_TERMS = ("weights", "gradients", "optimizer", "reference", "cuda_context")
DYNAMIC_TERMS = ("activations", "logits", "generation")
TERMS = ("weights", "gradients", "optimizer", "activations", "logits", "generation", "reference", "allocator",
         "cuda_context")
# The terms as a reader groups them: (column header of `autofit estimate`, label in plots, ledger terms summed).
TERM_GROUPS = (
    ("weights", "weights", ("weights",)),
    ("grads", "gradients", ("gradients",)),
    ("optim", "optimizer states", ("optimizer",)),
    ("activ", "activations", ("activations",)),
    ("logits", "logits", ("logits",)),
    ("gen", "KV cache / generation", ("generation",)),
    ("ref", "reference model", ("reference",)),
    ("ctx+alloc", "context and allocator", ("cuda_context", "allocator")),
)
TERM_HELP = {
    "weights": "model weights (quantized linears at 0.516/1 B, adapters, autocast copy, dequant transient)",
    "gradients": "gradients of the trainable parameters (resident in forward when grad_accum >= 2)",
    "optimizer": "optimizer states (+ the step's temporaries in the step phase)",
    "activations": "activations saved for backward (checkpointing keeps layer inputs)",
    "logits": "TRL's fused LM-head buffer, fp32 hidden/LM-head gradient accumulators",
    "generation": "RL generation: KV cache, per-step logits, prefill (PPO: the rollout's float32 logits, kept)",
    "reference": "frozen reference model (beta > 0 without LoRA; PPO: and its reward model)",
    "allocator": "caching allocator overhead (reserved - allocated)",
    "cuda_context": "CUDA context (and NCCL's buffers with several GPUs)",
}


@dataclass(frozen=True)
class Ledger:
    """Bytes live at the predicted peak, by term; ``total`` is their sum. ``phase`` names the peak phase and
    ``phase_totals`` gives every phase's total. ``uncertainty`` is the relative error band (0.25 = ±25 %)."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    logits: float = 0.0
    generation: float = 0.0
    reference: float = 0.0
    allocator: float = 0.0
    cuda_context: float = 0.0
    phase: str = "train"
    phase_totals: Dict[str, float] = field(default_factory=dict)
    uncertainty: float = PRIOR_UNCERTAINTY
    reserved_factor: float = 1.0
    host: float = 0.0  # host memory offloaded states and activations take: not device memory, not in ``total``
    refused: str = ""  # why the candidate cannot run on any budget (a colocated vLLM that does not start); "" if none

    @property
    def total(self) -> float:
        return float(sum(getattr(self, name) for name in TERMS))

    @property
    def allocated(self) -> float:
        """PyTorch's own peak (``torch.cuda.max_memory_allocated``): the total without the allocator's overhead and the
        CUDA context, which ``nvidia-smi`` and the search's CUDA meter count (``total``)."""
        return self.total - self.allocator - self.cuda_context

    @property
    def static(self) -> float:
        """What does not depend on the tokens (its allocator share included): what the static scale multiplies."""
        static = sum(getattr(self, n) for n in STATIC_TERMS if n != "cuda_context")
        return float(self.reserved_factor * static + self.cuda_context)

    @property
    def dynamic(self) -> float:
        """Activations, LM-head buffers, generation (allocator share included): what the dynamic scale multiplies."""
        return float(self.reserved_factor * sum(getattr(self, n) for n in DYNAMIC_TERMS))

    @property
    def low(self) -> float:
        return self.total * (1 - self.uncertainty)

    @property
    def high(self) -> float:
        return self.total * (1 + self.uncertainty)

    def fits(self, budget_bytes: float) -> bool:
        """The point prediction is within the budget (never where the candidate is ``refused``)."""
        return not self.refused and self.total <= budget_bytes

    def verdict(self, budget_bytes: float) -> str:
        """"yes" when even the high end of the band fits, "no" when even the low end does not (or the candidate is
        ``refused``), else "maybe"."""
        if self.refused:
            return "no"
        if self.high <= budget_bytes:
            return "yes"
        if self.low > budget_bytes:
            return "no"
        return "maybe"

    def terms(self) -> Dict[str, float]:
        return {name: getattr(self, name) for name in TERMS}

    def scaled(self, static_scale: float, dynamic_scale: float, uncertainty: float) -> Ledger:
        """This ledger with the static and dynamic terms scaled (calibration)."""
        changes = {n: getattr(self, n) * static_scale for n in STATIC_TERMS}
        changes.update({n: getattr(self, n) * dynamic_scale for n in DYNAMIC_TERMS})
        torch_part = sum(changes[n] for n in TERMS if n in changes and n != "cuda_context")
        changes["allocator"] = (self.reserved_factor - 1) * torch_part
        return replace(self, uncertainty=uncertainty, **changes)


@dataclass(frozen=True)
class _Phase:
    name: str
    terms: Dict[str, float]


ZERO_MASTER_SHARE = 4 / 12  # of ZeRO's optimizer bytes per trainable parameter: the fp32 master weight


def _phases(candidate: Candidate, shape: ModelShape, device: str) -> List[_Phase]:
    if candidate.unit.critic:  # PPO: a value model beside the policy, and the rollout (``_rollout``)
        return [_Phase(name, terms) for name, terms in rollout_phases(candidate, shape, device)]
    act_bytes = compute_bytes(candidate, shape, device)
    on_device = offloaded_state_bytes if candidate.optimizer_offload else state_bytes
    state = sharded_state(on_device(candidate, shape, device), candidate, shape, device)
    saved, layer_moment = activation_bytes(candidate, shape, act_bytes)
    logits = logit_bytes(candidate, shape, device, act_bytes, weight_bytes(candidate, shape))
    # offload: its staging buffers; several ranks: DDP's gradient buckets. ZeRO allocates its gradient partition
    # once the LM head's gradient is reduced, after the LM-head peak of "train" [V: CPU meter, a ZeRO-2 config of the
    # user's on tiny-qwen2: 139.62 MiB measured, the train phase without them 139.70 predicted]; its reduce buckets
    # live by phase (``zero_phase_buffers``)
    zero = zero_engine(candidate) is not None
    resident_gradients = candidate.grad_accum >= 2 or candidate.optimizer_offload or (candidate.ranks > 1 and not zero)
    static = {"weights": state.weights + state.autocast_copy, "reference": state.reference,
              "optimizer": state.optimizer, "gradients": state.gradients if resident_gradients else 0.0}
    backward_gradients = state.gradients if resident_gradients or zero else 0.0
    phases = [
        _Phase("train", {**static, "activations": saved, "logits": logits}),
        _Phase("backward", {**static, "activations": layer_moment, "gradients": backward_gradients + (
            gradient_transient_bytes(candidate, shape, device) if candidate.optimizer_offload else 0.0)}),
        _Phase("step", {"weights": state.weights, "reference": state.reference,
                        "gradients": state.gradients + state.step_gradients,
                        "optimizer": state.optimizer + max(state.step_temporaries, state.embedding_temporaries)}),
    ]
    if zero and not candidate.optimizer_offload:  # DeepSpeed's fp32 master weights exist from its setup, Adam's
        # states from the first step: the first backward holds 4 of the 12 bytes per trainable parameter [D:
        # DeepSpeed's optimizer state is created lazily by torch's and DeepSpeed's Adam at their first step]
        phases.append(_Phase("first_backward", {**phases[1].terms,
                                                "optimizer": state.optimizer * ZERO_MASTER_SHARE}))
    if candidate.optimizer_offload:
        phases.append(_Phase("engine_setup", {"weights": engine_setup_bytes(candidate, shape, device)}))
    if PRECOMPUTE in candidate.unit.phases and candidate.precompute_ref:  # the reference's log-probs, before training:
        # the policy's forward without gradients over the precompute batch (one layer's activations at a time)
        phases.append(_Phase(PRECOMPUTE, {"weights": state.weights, "activations": layer_moment, "logits": logits}))
    if candidate.is_rl and not candidate.vllm:  # with vLLM the trainer does not generate (``vllm``)
        phases.append(_Phase("generation", {"weights": state.weights, "reference": state.reference,
                                            "optimizer": state.optimizer,
                                            "generation": generation_bytes(candidate, shape, act_bytes)}))
    buffers = zero_phase_buffers(candidate, shape, device)
    phases = [_Phase(p.name, {**p.terms, "gradients": p.terms.get("gradients", 0.0) + buffers.get(p.name, 0.0)})
              for p in phases]
    return _with_vllm(phases, candidate, shape, device, {"weights": state.weights, "reference": state.reference,
                                                         "optimizer": state.optimizer})


def _with_vllm(phases: List[_Phase], candidate: Candidate, shape: ModelShape, device: str,
               resident: Dict[str, float]) -> List[_Phase]:
    """A colocated vLLM's share in the step's phases (the generation column), ``resident`` what the trainer holds
    between its steps. Awake, the share is held through every phase. Asleep outside generation (``vllm_sleep``, on a
    GPU: vLLM's CPU build has no sleep mode), the trainer's phases hold what vLLM keeps asleep, and two phases of
    its own hold the rest: the weight sync (vLLM's weights woken, and under ZeRO-3 with LoRA the trainer's whole
    model gathered to merge the adapters) and the generation (the whole share) [S: trl/generation/vllm_generation.py,
    VLLMGeneration.sync_weights, _iter_named_params, generate]."""
    reserved = vllm_term(candidate, shape)  # a colocated vLLM's share, held through the whole step
    if not reserved:
        return phases
    sleeping = candidate.vllm_sleep and device == "cuda"
    held = vllm_asleep_bytes(candidate, shape) if sleeping else reserved
    phases = [_Phase(p.name, {**p.terms, "generation": p.terms.get("generation", 0.0) + held}) for p in phases]
    gathered = resident["weights"] * (candidate.ranks - 1) if candidate.lora is not None and \
        shards_parameters(zero_engine(candidate)) else 0.0
    if sleeping:
        phases.append(_Phase("generation", {**resident, "generation": reserved}))
    if sleeping or gathered:
        vllm_held = held + vllm_weight_bytes(candidate, shape) if sleeping else reserved
        phases.append(_Phase("weight_sync", {**resident, "weights": resident["weights"] + gathered,
                                             "generation": vllm_held}))
    return phases


def _ledger(phase: _Phase, rho: float, context: float, totals: Dict[str, float], uncertainty: float,
            host: float, refused: str) -> Ledger:
    terms = {name: float(value) for name, value in phase.terms.items()}
    torch_part = sum(terms.values())
    return Ledger(**terms, allocator=(rho - 1) * torch_part, cuda_context=context, phase=phase.name,
                  phase_totals=totals, uncertainty=uncertainty, reserved_factor=rho, host=host, refused=refused)


def phase_ledgers(candidate: Candidate, shape: Optional[ModelShape] = None, *, device: Optional[str] = None
                  ) -> List[Ledger]:
    """One uncalibrated ledger per phase (train, step, and generation for grpo/rloo)."""
    shape = (shape or ModelShape.from_model(candidate.model)).with_attention(candidate.attn_implementation)
    device = device or candidate.device
    candidate = as_launched(candidate)  # a DeepSpeed offload of the user's: the offload engine's ledger
    rho = reserved_factor(candidate, device)
    context = context_bytes(device) + nccl_bytes(candidate, device)
    phases = _phases(candidate, shape, device)
    rungs = unmodelled_rungs(candidate)  # each says its effect on the terms, or the band it needs
    if rungs:
        phases = [_Phase(p.name, with_rungs(p.terms, candidate, rungs, shape)) for p in phases]
    totals = {p.name: rho * sum(p.terms.values()) + context for p in phases}
    uncertainty = prior_uncertainty(shape, candidate.algo)
    if unmodelled(candidate):  # no confident number for what the ledger does not describe
        uncertainty = max(uncertainty, UNCHECKED_UNCERTAINTY)
    uncertainty = max(uncertainty, widest_band(rungs)[0])
    host = host_bytes(candidate, shape, device)
    refused = vllm_refusal(candidate, shape)
    return [_ledger(p, rho, context, totals, uncertainty, host, refused) for p in phases]


def host_bytes(candidate: Candidate, shape: ModelShape, device: str) -> float:
    """Host memory the candidate's offloading takes at most (pinned on a GPU machine): the optimizer's offloaded
    states, shards and activations, as the candidate's rungs say (``host_bytes``)."""
    return rung_host_bytes(candidate, shape, device)


def predict(candidate: Candidate, shape: Optional[ModelShape] = None, *, device: Optional[str] = None) -> Ledger:
    """The uncalibrated ledger at the predicted peak phase. ``shape`` defaults to the candidate's model config,
    ``device`` to the candidate's device ("cuda": bf16 autocast, CUDA context, allocator overhead)."""
    return max(phase_ledgers(candidate, shape, device=device), key=lambda ledger: ledger.total)
