"""The host's memory, checked against what a search would put in it before anything is probed.

On the CPU (no GPU here, or ``--device cpu``) the simulated device is the host's memory: a search whose first probe
would need more than the host has available is refused at once (``check_host_memory``), since the kernel's OOM killer
would end each probe minutes in (or another process on a shared machine), with one line naming both and the estimate
command that answers without a GPU. What the first probe needs is the memory model's prediction of the candidate the
walk probes first (``predicted_first_probe``), at most the budget (the simulated meter raises out-of-memory there), or
the budget itself where the model cannot predict (docs/decisions.md, "No GPU, no trap").

For an offloading engine: DeepSpeed pins its offloaded states; a machine without that much free RAM swaps or kills the
run (and the probe would measure nothing useful), so the rung is left out with a note instead.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from autofit.core import Candidate, InputError, SearchSpec, format_size
from autofit.rungs import LadderState, Rung, climb, resolve_ladder, usable_rungs
from autofit.search._command_line import estimate_command

if TYPE_CHECKING:
    from autofit.memory_model import Ledger, ModelShape

log = logging.getLogger(__name__)


def available_host_bytes(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """MemAvailable (the kernel's estimate of what can be allocated without swapping), or None where unknown."""
    try:
        with open(meminfo) as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _least_need(candidate: Candidate, shape: ModelShape, device: str) -> float:
    """The least host memory a level can get by with: optimizer offload with gradient accumulation where the
    effective batch can be split (its fp32 buffer counted), offloaded activations at micro-batch 1."""
    from autofit.memory_model import host_bytes

    if candidate.effective_batch > 1:
        candidate = candidate.replace(micro_batch=1, grad_accum=candidate.effective_batch)
    return host_bytes(candidate, shape, device)


def host_shortfalls(start: LadderState, rungs: Sequence[Rung], shape: Optional[ModelShape], device: str,
                    available: Optional[int] = None) -> List[Tuple[str, str]]:
    """(rung, note) for each offloading rung (one with ``host_memory`` words) whose levels need more host memory than
    is available, even at their smallest micro-batch, in the ladder's order; empty when they fit (or nothing offloads,
    or the sizes or the machine's RAM are unknown)."""
    if shape is None:
        return []
    available = available if available is not None else available_host_bytes()
    rungs = list(rungs)
    found: List[Tuple[str, str]] = []
    for name, what in [(rung.name, what) for rung in rungs if (what := getattr(rung, "host_memory", ""))]:
        needs = [_least_need(state.candidate, shape, device) for state in climb(start, rungs) if name in state.rungs]
        if not needs or available is None or min(needs) <= available:
            continue
        rungs = [rung for rung in rungs if rung.name != name]
        found.append((name, f"rung {name} left out: its {what} need {format_size(min(needs))} of host memory, "
                            f"{format_size(available)} is available"))
    return found


def probeable_rungs(start: LadderState, rungs: Sequence[Rung], model: str, device: str
                    ) -> Tuple[List[Rung], List[str]]:
    """The rungs a search on this machine climbs, and a note for each one left out (a missing engine, too little
    host memory for what is offloaded), and one for each the memory model does not describe (another package's)."""
    from autofit.memory_model import rung_notes, shape_or_none

    usable, notes = usable_rungs(rungs, device, start)
    for name, note in host_shortfalls(start, usable, shape_or_none(model), device):
        log.info("%s", note)
        notes.append(note)
        usable = [rung for rung in usable if rung.name != name]
    return usable, notes + rung_notes(usable)


def predicted_first_probe(spec: SearchSpec) -> Optional[Tuple[Candidate, Ledger]]:
    """The candidate a search probes first and the memory model's (uncalibrated) ledger of it, as the walk picks it:
    the first level with a candidate the model does not rule out (its low end within the budget's limit), there the
    largest micro-batch predicted to fit (the heaviest not ruled out below it where that one is); without a budget,
    the first level's largest. With ``--no-predict`` (nothing predicted, nothing ruled out): the first level's smallest
    micro-batch, or its largest without a budget. None where the ledger does not describe the model."""
    from autofit.memory_model import divisors, length_grid, predict, start_state

    try:
        from autofit.memory_model import ModelShape

        shape = ModelShape.from_model(spec.options.model)
        start = start_state(spec, shape)
        rungs, _ = usable_rungs(resolve_ladder(spec.ladder), spec.device, start, logged=False)
        levels = climb(start, rungs)
    except (KeyError, ValueError, TypeError):  # an architecture (or a ladder) the memory model does not describe
        return None
    budget = spec.budget_bytes
    limit = budget * (1 - spec.headroom) if budget is not None else None

    def ledger(candidate: Candidate) -> Optional[Ledger]:
        try:
            return predict(candidate, shape)
        except (KeyError, ValueError, ZeroDivisionError):
            return None

    def sized(state: LadderState, sizes: Sequence[Tuple[int, int]]) -> List[Tuple[Candidate, Optional[Ledger]]]:
        """The level's candidates at (micro-batch, length) ``sizes``, with their ledgers."""
        per_rank = state.per_rank(spec.rank_batch)
        made = [state.candidate.replace(micro_batch=b, grad_accum=per_rank // b, max_length=n) for b, n in sizes]
        return [(candidate, ledger(candidate)) for candidate in made]

    for state in levels if spec.options.predict else levels[:1]:
        # the level's candidates in the walk's order of size, smallest first (``Walk.search_level``)
        batches = divisors(state.per_rank(spec.rank_batch)) if state.vary_batch else [state.candidate.micro_batch]
        if spec.options.maximize == "length":
            made = sized(state, [(batches[0], n) for n in length_grid(spec.min_length, spec.max_length)])
        else:
            made = sized(state, [(b, spec.max_length) for b in batches])
        if limit is None or not spec.options.predict:
            candidate, found = made[-1] if limit is None else made[0]
            return (candidate, found) if found is not None else None
        first = _first_probed(made, limit, spec.factory is None)
        if first is None and state.vary_length and spec.options.maximize == "batch":  # then shorter, at the smallest
            made = sized(state, [(batches[0], n) for n in length_grid(spec.min_length, spec.max_length)[:-1]])
            first = _first_probed(made, limit, spec.factory is None)
        if first is not None:
            return first
    return None


def _first_probed(made: Sequence[Tuple[Candidate, Optional[Ledger]]], limit: float, rules_out: bool
                  ) -> Optional[Tuple[Candidate, Ledger]]:
    """Of one level's candidates (smallest first) and their ledgers, the one the walk probes first (the largest
    predicted within ``limit``, else the smallest), or where the model rules that out (``rules_out``: a built-in
    trainer's, its low end over the limit), the heaviest below it that is not ruled out; None where all are."""
    known = [(candidate, found) for candidate, found in made if found is not None]
    if len(known) < len(made) or not known:
        return None  # a candidate the ledger cannot describe: the walk bisects without the model there
    start = max([i for i, (_, found) in enumerate(known) if found.total <= limit], default=0)
    probed = [i for i in range(start + 1) if not (rules_out and known[i][1].low > limit)]
    if not probed:
        return None
    return known[start] if start in probed else max((known[i] for i in probed), key=lambda pair: pair[1].total)


def host_refusal(spec: SearchSpec, available: Optional[int] = None) -> Optional[str]:
    """The one line refusing a search on the CPU whose first probe needs more memory than the host has available;
    None where it fits, on CUDA, where probes are handed out to workers, or where the host's memory is unknown."""
    if spec.device != "cpu" or spec.options.workers is not None:
        return None
    available = available if available is not None else available_host_bytes()
    if available is None:
        return None
    options, budget = spec.options, spec.budget_bytes
    first = predicted_first_probe(spec)
    given = f"--gpu-memory {options.gpu_memory}" if options.gpu_memory is not None else ""
    if first is not None:
        candidate, ledger = first
        need = min(ledger.total, budget) if budget is not None else ledger.total
        what = f"its first probe ({'+'.join(candidate.rungs) or 'baseline'}: {candidate.describe()}) is predicted at " \
               f"{format_size(ledger.total)}"
        if budget is not None:
            what += f" within the {format_size(budget)} budget of {given}" if ledger.total <= budget else \
                f", and may take the whole {format_size(budget)} budget of {given}"
    elif budget is not None:
        need, what = budget, f"its probes may take the whole {format_size(budget)} budget of {given}"
    else:
        return None  # nothing known to weigh: the search asks for a budget
    slots = len(options.gpus_for_probes or ()) or 1  # simulated devices side by side: each its own budget
    need *= slots
    if need <= available:
        return None
    side = f" on each of {slots} simulated devices" if slots > 1 else ""
    where = "no GPU here, so " if options.device == "auto" else ""
    room = (f"a --gpu-memory of at most {format_size(available // slots)} probes here instead"
            if budget is not None else "--gpu-memory names your card or its size")
    return (f"{where}a search simulates the device in this machine's memory: {what}{side}, more than the "
            f"{format_size(available)} available; `{estimate_command(options)}` answers without a GPU ({room})")


def check_host_memory(spec: SearchSpec) -> None:
    """``InputError`` (exit 2, before anything is written or probed) with ``host_refusal``'s line, where it has one;
    a model no built-in trainer can load says so first, as the search would (``autofit.search._guide.model_shape``)."""
    refusal = host_refusal(spec)
    if refusal is None:
        return
    from autofit.memory_model import NoCausalLM, ensure_census

    try:
        ensure_census(spec.options.model, trust_remote_code=spec.options.trust_remote_code)
    except NoCausalLM as exc:
        if spec.factory is None:
            raise InputError(str(exc)) from None
    raise InputError(refusal)
