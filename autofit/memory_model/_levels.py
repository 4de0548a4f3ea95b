"""Which rung the model expects to be needed: the ladder walked over predicted peaks (``autofit estimate``), and the
search's grids of micro-batches and lengths."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from autofit.core import RL_ALGOS, Candidate, SearchSpec, engine_of
from autofit.memory_model._calibration import Calibration, predict_calibrated
from autofit.memory_model._ledger import Ledger
from autofit.memory_model._shape import ModelShape
from autofit.memory_model._vllm import server_fits, vllm_need

if TYPE_CHECKING:
    from autofit.rungs import LadderState


def divisors(n: int) -> List[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def length_grid(low: int, high: int) -> List[int]:
    """The search's grid of sequence lengths from ``low`` to ``high``: multiples of a step that keeps about 64
    points (``autofit.search`` uses it too)."""
    step = max(8, 2 ** int(math.log2(max(high, 8) / 64))) if high > low else 1
    inner = range((low // step + 1) * step, high, step)
    return sorted({low, *inner, high})


def base_candidate(spec: SearchSpec) -> Candidate:
    """The ladder's starting point, as the search builds it: the user's own run where ``--config`` gave one (its
    micro-batch split, checkpointing, LoRA, quantization, optimizer), else micro-batch = the effective batch (per
    rank), no accumulation, full length, checkpointing off."""
    options = spec.options
    candidate = Candidate(
        algo=options.algo,
        model=options.model,
        device=spec.device,
        micro_batch=spec.rank_batch,
        grad_accum=1,
        ranks=spec.ranks,
        vllm=options.use_vllm,
        vllm_utilization=options.vllm_gpu_memory_utilization if options.use_vllm == "colocate" else None,
        vllm_share_bytes=int(options.vllm_gpu_memory_utilization * spec.gpu_bytes)
        if options.use_vllm == "colocate" and spec.gpu_bytes else None,
        max_length=spec.max_length,
        user_args=tuple(sorted(spec.user_args.items())),
        real_weights=options.real_weights,
        dtype=options.dtype,
        trust_remote_code=options.trust_remote_code,
        num_generations=options.num_generations,
        prompt_length=options.max_prompt_length if options.algo in RL_ALGOS else None,
    )
    user = spec.baseline
    if user is None:
        return candidate
    changes: Dict[str, Any] = user.candidate_changes(spec.device)
    engine = engine_of(user.sharding)
    if engine is not None and engine.optimizer_offload:
        changes["offload"] = user.sharding
    elif user.sharding:
        changes["sharding"] = user.sharding
    if user.micro_batch is not None and user.grad_accum is not None:
        changes.update(micro_batch=user.micro_batch, grad_accum=user.grad_accum)
    return candidate.replace(**changes)


def start_state(spec: SearchSpec, shape: Optional[ModelShape] = None) -> LadderState:
    """The ladder's first level (``base_candidate``) with what its rungs may ask of the memory model: what a colocated
    vLLM needs of its share (the vllm-share rung sizes it). ``shape``: the model's, where it is known."""
    from autofit.rungs import LadderState

    need = fits = None
    if spec.options.use_vllm == "colocate" and shape is not None:
        def need(candidate: Candidate) -> int:
            return int(vllm_need(candidate, shape))

        gpu_bytes = spec.gpu_bytes
        if gpu_bytes and spec.options.nodes == 1:  # the server on GPUs of this one node
            def fits(candidate: Candidate, gpus: int) -> bool:
                return server_fits(candidate, shape, gpu_bytes, gpus)

    return LadderState(base_candidate(spec), min_length=spec.min_length, maximize=spec.options.maximize,
                       vllm_need=need, vllm_server_fits=fits)


@dataclass
class LevelEstimate:
    level: int
    rungs: Tuple[str, ...]
    cost: str
    candidate: Candidate  # the largest micro-batch (or longest length) predicted to fit; else the smallest tried
    ledger: Ledger
    fits: bool  # point prediction within the budget
    # the level's largest micro-batch at the full length fits (with ``maximize="length"``: the full length): the
    # search's walk compares no later level (``autofit.search._walk``)
    top: bool = False


@dataclass
class RungEstimate:
    budget_bytes: int
    levels: List[LevelEstimate]
    # The first level predicted to fit, without the rungs it is predicted not to need (``dropped``); None: nothing is
    # predicted to fit.
    expected: Optional[LevelEstimate]
    dropped: Tuple[str, ...] = ()

    @property
    def rungs(self) -> Optional[Tuple[str, ...]]:
        return self.expected.rungs if self.expected is not None else None

    @property
    def rung(self) -> Optional[str]:
        """The rung the model expects to be needed first ("baseline" when none is; None when nothing fits)."""
        if self.expected is None:
            return None
        return self.expected.rungs[-1] if self.expected.rungs else "baseline"


def _predictor(calibration: Optional[Calibration], shape: ModelShape) -> Callable[[Candidate], Ledger]:
    def at(candidate: Candidate) -> Ledger:
        return predict_calibrated(candidate, calibration, shape)

    return at


def _best_at_level(state: LadderState, spec: SearchSpec, budget: int, predict_at: Callable[[Candidate], Ledger]
                   ) -> Tuple[Candidate, Ledger, bool]:
    effective = state.per_rank(spec.rank_batch)
    batches = divisors(effective) if state.vary_batch else [state.candidate.micro_batch]  # the level's own
    min_length = spec.min_length
    maximize = spec.options.maximize

    def at(batch: int, length: int) -> Candidate:
        return state.candidate.replace(micro_batch=batch, grad_accum=effective // batch, max_length=length)

    def scan(pairs: Iterable[Tuple[int, int]]) -> Optional[Tuple[Candidate, Ledger]]:
        for batch, length in pairs:  # largest first
            candidate = at(batch, length)
            ledger = predict_at(candidate)
            if ledger.fits(budget):
                return candidate, ledger
        return None

    if maximize == "length":
        found = scan((batches[0], n) for n in reversed(length_grid(min_length, spec.max_length)))
    else:
        found = scan((b, spec.max_length) for b in reversed(batches))
        if found is None and state.vary_length:
            found = scan((b, n) for n in reversed(length_grid(min_length, spec.max_length)[:-1])
                         for b in reversed(batches))
    if found is not None:
        return found[0], found[1], True
    smallest = at(batches[0], min_length if (state.vary_length or maximize == "length") else spec.max_length)
    return smallest, predict_at(smallest), False


def expected_rung(spec: SearchSpec, budget_bytes: Optional[int] = None, *, calibration: Optional[Calibration] = None,
                  shape: Optional[ModelShape] = None, rungs: Optional[Sequence[Any]] = None) -> RungEstimate:
    """Walk the ladder (``spec.ladder`` or the default order) over predicted peaks: at each level the largest
    divisor of the effective batch predicted to fit (shorter lengths once that rung is on, or the longest length
    with ``maximize="length"``); the first level with a fit is the rung the model expects to be needed."""
    from autofit.rungs import climb, resolve_ladder, usable_rungs

    budget = budget_bytes if budget_bytes is not None else spec.budget_bytes
    if budget is None:
        raise ValueError("expected_rung needs a budget")
    shape = shape or (calibration.shape if calibration is not None and calibration.shape is not None else None) \
        or ModelShape.from_model(spec.options.model)
    rungs = list(rungs) if rungs is not None else resolve_ladder(spec.ladder)
    start = start_state(spec, shape)
    rungs, _ = usable_rungs(rungs, spec.device, start)  # as the search climbs it
    predict_at = _predictor(calibration, shape)
    levels = []
    for index, state in enumerate(climb(start, rungs)):
        candidate, ledger, fits = _best_at_level(state, spec, budget, predict_at)
        largest = state.per_rank(spec.rank_batch) if state.vary_batch else state.candidate.micro_batch
        top = fits and candidate.max_length == spec.max_length and (
            spec.options.maximize == "length" or candidate.micro_batch == largest)
        levels.append(LevelEstimate(index, tuple(state.rungs), state.cost, candidate, ledger, fits, top))
    expected = next((level for level in levels if level.fits), None)
    if expected is None:
        return RungEstimate(budget, levels, None)
    pruned, dropped = _without_needless(expected, start, rungs, spec, budget, predict_at)
    return RungEstimate(budget, levels, pruned, dropped)


def _without_needless(expected: LevelEstimate, start: LadderState, rungs: Sequence[Any], spec: SearchSpec,
                      budget: int, predict_at: Callable[[Candidate], Ledger]
                      ) -> Tuple[LevelEstimate, Tuple[str, ...]]:
    """The expected level without the earlier rungs it is predicted not to need, as the search prunes
    (``autofit.search._pruning``): a quality rung when the level fits without it, a speed rung (checkpointing,
    offloading) when it fits without it at the same micro-batch and length. No timing is predicted, so a speed rung
    that buys a larger micro-batch is kept."""
    from autofit.rungs import FREE, FREE_UNDER_ADAPTERS, NEVER_DROPPED, QUALITY, climb

    if start.vary_length or spec.options.maximize == "length" or not expected.rungs:
        return expected, ()
    applied = [rung for rung in rungs if rung.name in expected.rungs]
    adapters = expected.candidate.lora is not None or expected.candidate.quantization is not None
    kept, best, dropped = list(applied), expected, []
    for rung in reversed(applied[:-1]):  # the last rung made the level fit
        if rung.cost == FREE or rung.name in NEVER_DROPPED or (adapters and rung.name in FREE_UNDER_ADAPTERS):
            continue
        trial = [r for r in kept if r is not rung]
        state = climb(start, trial)[-1]
        if rung.name in state.rungs or state.vary_length:
            continue  # another rung brings it back, or the level would shorten sequences
        candidate, ledger, fits = _best_at_level(state, spec, budget, predict_at)
        as_large = (candidate.micro_batch >= best.candidate.micro_batch
                    and candidate.max_length >= best.candidate.max_length)
        if fits and (rung.cost == QUALITY or as_large):
            best = LevelEstimate(expected.level, tuple(state.rungs), state.cost, candidate, ledger, True)
            kept = trial
            dropped.append(rung.name)
    return best, tuple(dropped)
