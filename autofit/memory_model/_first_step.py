"""The first optimizer step as a phase of its own: what a run holds before its optimizer's states exist.

torch's AdamW, bitsandbytes' 8-bit AdamW and DeepSpeed's Adam create their states lazily, at the first
``optimizer.step()`` [D: torch.optim.AdamW ``_init_group`` fills ``self.state[p]`` on the first step; bitsandbytes'
``Optimizer8bit.init_state`` is called from ``step``; DeepSpeed's ZeRO builds its fp32 master partition at setup and
Adam's moments at the first step]. So the first step's generation, forward and backward hold none of the states (ZeRO:
its master weights only), and its optimizer step creates them; from the second step every phase holds them. GRPO users
report exactly this: step 1 runs, step 2 runs out of memory at generation, once the states sit beside vLLM's share or
the rollout's cache. The ledger's phases (``_ledger.phase_ledgers``) are the steady state; this module derives the
first step's from them, with the allocator's reserve scaled as the ledger scales it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Sequence

from autofit.core import Candidate
from autofit.memory_model._engine_settings import zero_engine
from autofit.memory_model._ledger import ZERO_MASTER_SHARE, Ledger

FIRST_STEP_ONLY = ("first_backward",)  # the ledger's own first-step phase (ZeRO): not a phase of later steps


def first_step_optimizer_share(candidate: Candidate) -> float:
    """The part of the steady optimizer term a run holds before its first step: ZeRO's fp32 master weights on the
    device (4 of its 12 bytes per trainable parameter), nothing for torch's and bitsandbytes' optimizers (an offload
    keeps its states on the host, where the device term is already none)."""
    return ZERO_MASTER_SHARE if zero_engine(candidate) is not None and not candidate.optimizer_offload else 0.0


def first_step_ledgers(ledgers: Sequence[Ledger], candidate: Candidate) -> List[Ledger]:
    """The step's phases as the first step runs them: every phase before the optimizer step without the optimizer's
    states (the ledger's ``first_backward`` is that backward already), the step itself as later steps run it."""
    share = first_step_optimizer_share(candidate)
    first: List[Ledger] = []
    for ledger in ledgers:
        if ledger.phase == "step" or ledger.phase in FIRST_STEP_ONLY:
            first.append(ledger)
            continue
        if any(other.phase == "first_backward" for other in ledgers) and ledger.phase == "backward":
            continue  # the ledger's first_backward stands for it
        optimizer = ledger.optimizer * share
        held = ledger.total - ledger.allocator - ledger.cuda_context - (ledger.optimizer - optimizer)
        first.append(replace(ledger, optimizer=optimizer, allocator=(ledger.reserved_factor - 1) * held))
    return first


def steady_ledgers(ledgers: Sequence[Ledger]) -> List[Ledger]:
    """The step's phases from the second step on (the ledger's, less its first-step-only phases)."""
    return [ledger for ledger in ledgers if ledger.phase not in FIRST_STEP_ONLY]


@dataclass(frozen=True)
class StepPeaks:
    """The first step's peak and the steady one (from step 2), each with its phase."""

    first: Ledger
    steady: Ledger

    def failing_step(self, budget: float) -> Optional[int]:
        """1 where the first step's peak is over ``budget``, 2 where only the steady one is, None where both fit."""
        if self.first.total > budget:
            return 1
        return 2 if self.steady.total > budget else None


def step_peaks(ledgers: Sequence[Ledger], candidate: Candidate) -> StepPeaks:
    """The peaks of the first step and of the steady state over a step's phase ledgers."""
    return StepPeaks(first=max(first_step_ledgers(ledgers, candidate), key=lambda ledger: ledger.total),
                     steady=max(steady_ledgers(ledgers), key=lambda ledger: ledger.total))
