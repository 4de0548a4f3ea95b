"""The ladder: an ordered list of rungs, each a memory optimization the search may climb to.

A rung is a small object with a ``name``, a ``cost`` class and ``apply(state) -> state | None`` (None when it
does not apply). Rungs are cumulative: each level of the ladder is the previous level with one more rung applied.
The rungs themselves live beside it, one module per optimization; ``autofit.rungs._default`` has the default order
and ``resolve_ladder`` (rungs by name).

A launch with its own engine (``fsdp:``/``fsdp_config:``, a ``deepspeed:`` block, an accelerate config that runs FSDP
or ZeRO) keeps it on every rung that does not replace it (micro-batch, checkpointing, LoRA, quantization, ...). A rung
that runs an engine of autofit's own (``runs_an_engine``: the shardings, optimizer offload) would replace it: it is
climbed after all the others, from the last level that changes no training, as a quality level; its candidate drops
the user's engine arguments (the probe runs autofit's engine, best.yaml names autofit's accelerate.yaml) and says which
engine it replaces (``Candidate.replaces``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from autofit.core import ENGINES, Candidate, engine_for, keys_of
from autofit.rungs.engines import deepspeed_engine

log = logging.getLogger(__name__)

# Cost classes, from free to costly.
FREE = "free"  # same math, same speed or faster
SPEED = "speed"  # same math, slower
QUALITY = "quality"  # different training
COSTS = (FREE, SPEED, QUALITY)
OFFLOAD_RUNG = "optimizer-offload"  # autofit.rungs._offload: taken off again by the quality rungs
SERVER_RUNG = "vllm-server"  # autofit.rungs.vllm: taken off again by the quality rungs, vLLM colocated as before it
# Rungs a fit is never tried without (they only widen the search), and one that costs nothing under adapters (they
# train in float32 whatever the base's dtype): autofit.search._pruning and the estimate's expected configuration.
NEVER_DROPPED = ("micro-batch", "expandable-segments")
FREE_UNDER_ADAPTERS = ("bf16-weights",)
# autofit.rungs._sharding's offloading variants: the quality rungs shrink the level with the shards on the GPU
SHARDS_BACK_ON_GPU = {name: engine_for(engine.stage, fsdp=engine.fsdp) for name, engine in ENGINES.items()
                      if engine.sharding and engine.offloads_parameters}
# The training arguments that run an engine of the user's own: a rung that replaces it takes them out of the candidate
ENGINE_ARGS = keys_of("engine")


@dataclass(frozen=True)
class LadderState:
    """One level of the ladder: a candidate template plus which knobs the search may still turn."""

    candidate: Candidate  # micro_batch and max_length are the search's starting point, not final
    cost: str = FREE
    vary_batch: bool = False  # micro-batch may shrink below the effective batch (with accumulation)
    vary_length: bool = False  # max_length may shrink down to the user's floor
    min_length: int = 0
    maximize: str = "batch"  # "batch" or "length"
    # The engine of the user's launch (autofit's name for it, "" where it names no ZeRO stage) and in words; None: the
    # launch runs none of its own. Set by ``climb`` from the first level.
    own_engine: Optional[str] = None
    own_engine_words: str = ""
    # What a colocated vLLM needs of its share to start and hold the batch, in bytes, for a candidate: the memory
    # model's (set where it knows the model; the vllm-share rung reads it), None where it is not known
    vllm_need: Optional[Callable[[Candidate], int]] = None
    # Whether ``trl vllm-serve`` starts on that many of the node's GPUs (tensor parallel) and holds TRL's batch: the
    # memory model's (the vllm-server rung asks it), None where it is not known
    vllm_server_fits: Optional[Callable[[Candidate, int], bool]] = None
    # The sequences each rank trains per optimizer step where a rung changed the ranks (vllm-server: the node's
    # effective batch over fewer ranks); None: the question's (``SearchSpec.rank_batch``)
    rank_batch: Optional[int] = None
    # The level the vllm-server rung climbed from (vLLM colocated): the quality rungs climb on from it
    colocated: Optional[LadderState] = None

    def per_rank(self, asked: int) -> int:
        """The sequences each rank trains per optimizer step at this level; ``asked``: the question's."""
        return self.rank_batch or asked

    def with_rung(self, rung: Rung, **state_changes) -> LadderState:
        candidate_changes = state_changes.pop("candidate_changes", {})
        if rung.cost == QUALITY and SERVER_RUNG in self.candidate.rungs and self.colocated is not None:
            return self.colocated.with_rung(rung, **state_changes, candidate_changes=candidate_changes)
        candidate = self.candidate
        # quality rungs shrink the level without the optimizer offload a rung added (the user's engine is kept)
        if rung.cost == QUALITY and candidate.optimizer_offload and OFFLOAD_RUNG in candidate.rungs:
            candidate = candidate.replace(offload=None, rungs=tuple(r for r in candidate.rungs if r != OFFLOAD_RUNG))
        if rung.cost == QUALITY and candidate.sharding in SHARDS_BACK_ON_GPU and candidate.sharding in candidate.rungs:
            candidate = candidate.replace(sharding=SHARDS_BACK_ON_GPU[candidate.sharding],
                                          rungs=tuple(r for r in candidate.rungs if r != candidate.sharding))
        return dataclasses.replace(
            self,
            candidate=candidate.with_rung(rung.name, **candidate_changes),
            cost=max(self.cost, rung.cost, key=COSTS.index),
            **state_changes,
        )

    @property
    def rungs(self):
        return self.candidate.rungs

    def replacing_engine(self, rung: Rung, **candidate_changes) -> LadderState:
        """``rung``, an engine of autofit's, climbed where it replaces the user's: a quality level whose candidate
        runs without the user's engine arguments and says which engine it replaces."""
        candidate = self.candidate
        candidate = candidate.replace(user_args=tuple((k, v) for k, v in candidate.user_args if k not in ENGINE_ARGS),
                                      replaces=self.own_engine_words)
        state = dataclasses.replace(self, candidate=candidate).with_rung(rung, candidate_changes=candidate_changes)
        return dataclasses.replace(state, cost=QUALITY)


class Rung(Protocol):
    name: str
    cost: str
    help: str

    def apply(self, state: LadderState) -> Optional[LadderState]: ...

    # Optional: ``unavailable(device) -> str | None``, why the rung cannot be probed on this machine.


def replacement_words(replaces: str, engine: str) -> str:
    """The trade of a rung whose engine replaced the user's (``Candidate.replaces``), before the rung's own."""
    return f"replaces your launch's {replaces} with {engine} (run best.yaml with the accelerate.yaml autofit writes, " \
           "not your own)"


def replaces_engine(rung: Rung) -> bool:
    """Whether ``rung`` runs an engine of autofit's own (its DeepSpeed or FSDP configuration)."""
    return bool(getattr(rung, "runs_an_engine", False))


def climb(base: LadderState, rungs: Sequence[Rung]) -> List[LadderState]:
    """The levels of the ladder, base first; rungs that do not apply are skipped. Where the user's launch runs its
    own engine, the rungs that would replace it come last, each from the last level of the free and speed classes
    (or the replacing level before it)."""
    own = own_engine(base.candidate)
    if own is not None:
        base = dataclasses.replace(base, own_engine=own[0], own_engine_words=own[1])
    replacing = [rung for rung in rungs if own is not None and replaces_engine(rung)]
    levels = [base]
    for rung in rungs:
        if any(rung is other for other in replacing):
            continue
        nxt = rung.apply(levels[-1])
        if nxt is not None:
            levels.append(nxt)
    start = next(level for level in reversed(levels) if level.cost != QUALITY)
    for rung in replacing:
        nxt = rung.apply(start)
        if nxt is not None:
            levels.append(nxt)
            start = nxt
    return levels


def own_engine(candidate: Candidate) -> Optional[Tuple[str, str]]:
    """The engine of the user's launch at the ladder's first level (DeepSpeed or FSDP), as (autofit's name for it,
    "" where none fits; words), or None."""
    args = dict(candidate.user_args)
    if args.get("fsdp") or args.get("fsdp_config"):
        # the keys, not fsdp's value: transformers 4 keeps "full_shard auto_wrap", 5 makes it True; one wording for both
        keys = ", ".join(f"{key}:" for key in ("fsdp", "fsdp_config") if args.get(key))
        return candidate.sharding or "", f"FSDP ({keys})"
    if args.get("deepspeed"):
        engine = deepspeed_engine(args["deepspeed"]) or ""
        facts = ENGINES.get(engine)
        words = (f"ZeRO-{facts.stage}" + (" with optimizer offload" if facts.offloads_optimizer else "")
                 if facts else "configuration")
        return engine, f"DeepSpeed {words} (deepspeed:)"
    launched = candidate.named_engine
    if launched and not candidate.rungs:  # the launch's (accelerate_config:, --accelerate-config, accelerate launch)
        return launched, f"{launched} engine (its accelerate config)"
    return None


def usable_rungs(rungs: Sequence[Rung], device: str, start: Optional[LadderState] = None, *, logged: bool = True
                 ) -> Tuple[List[Rung], List[str]]:
    """The rungs this machine can probe, and a note for each one left out (a rung may say why it cannot run), and one
    for those that would replace the engine of the user's launch (logged unless ``logged=False``). With ``start``, a
    rung that applies to no level climbed from it (sharding on one GPU) is not checked."""
    applied = None
    if start is not None:
        applied = {name for level in climb(start, rungs) for name in level.rungs}
    usable: List[Rung] = []
    left_out: Dict[str, List[str]] = {}  # reason -> the rungs it leaves out
    own = own_engine(start.candidate) if start is not None else None
    replacing: List[str] = []
    for rung in rungs:
        if applied is not None and rung.name not in applied:
            usable.append(rung)  # it never applies here: nothing to check, nothing to say
            continue
        reason = rung.unavailable(device) if hasattr(rung, "unavailable") else None
        if reason:
            left_out.setdefault(reason, []).append(rung.name)
            continue
        usable.append(rung)
        if own is not None and replaces_engine(rung):
            replacing.append(rung.name)
    notes = [f"rung{'s' if len(names) > 1 else ''} {', '.join(names)} left out: {reason}"
             for reason, names in left_out.items()]
    # in the order they are climbed, which the search's ranking of quality fits reads (``search._margin``)
    usable = [rung for rung in usable if rung.name not in replacing] + \
        [rung for rung in usable if rung.name in replacing]
    if own is not None and replacing:
        notes.append(f"rung{'s' if len(replacing) > 1 else ''} {', '.join(replacing)} would replace your launch's "
                     f"{own[1]} with autofit's engine: quality levels, climbed after the rungs that keep your engine, "
                     "from the last level that changes no training; where one is chosen, best.yaml drops your "
                     "engine's keys and runs with the accelerate.yaml autofit writes")
    for note in notes if logged else ():
        log.info("%s", note)
    return usable, notes
