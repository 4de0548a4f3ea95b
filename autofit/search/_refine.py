"""Refinement: the probes left under ``--max-probes`` go to an Optuna sampler looking for a faster fit.

The walk measures the largest micro-batch that fits at each level; the fastest configuration need not be that one
(a smaller micro-batch without recomputation, a level whose kernels suit the shapes better). The sampler (TPE,
seeded, so a resumed search asks the same questions) sees the walk's probes as its history, their tokens per second
as the objective and peak minus budget as the constraint Optuna's constrained TPE reads, and proposes
(level, micro-batch) pairs of the winning cost class at the chosen length. A pair already known costs nothing; the
caller answers the others, by a probe or, when the memory model rules the pair out, without one. It stops when
every pair is known, when the asks run out, or when the caller's probe limit raises.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Dict, List, Tuple

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import TPESampler
from optuna.trial import TrialState, create_trial

from autofit.core import Candidate, ProbeResult, SearchSpec
from autofit.memory_model import divisors
from autofit.rungs import QUALITY
from autofit.search._choice import Choice
from autofit.search._grid import Grid
from autofit.search._guide import MemoryGuide
from autofit.search._probing import Prober
from autofit.search._result import Fit, ProbeLimitReached, SearchReport
from autofit.search._store import ProbeStore

log = logging.getLogger(__name__)

Point = Tuple[int, int]  # (ladder level, micro-batch)
Score = Tuple[float, float]  # (tokens per second, 0 when it does not fit; peak minus the budget, > 0 when over)
Evaluate = Callable[[int, Candidate], Score]

CONSTRAINT = "peak_minus_budget"
ASKS_PER_POINT = 8  # the sampler may propose known points again; this bounds the asks without a new answer
STARTUP_TRIALS = 2  # random proposals before TPE models the history (the walk's probes count towards them)


def refine(space: Dict[Point, Candidate], known: Dict[Point, Score], evaluate: Evaluate, *, seed: int = 0
           ) -> Dict[Point, Score]:
    """Every point answered, ``known`` included. ``evaluate(level, candidate)`` may raise to stop early."""
    distributions: Dict[str, BaseDistribution] = {
        "level": CategoricalDistribution(sorted({level for level, _ in space})),
        "micro_batch": CategoricalDistribution(sorted({batch for _, batch in space})),
    }
    sampler = TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    answers = {point: score for point, score in known.items() if point in space}
    for (level, batch), (value, over) in sorted(answers.items()):
        study.add_trial(create_trial(params={"level": level, "micro_batch": batch}, distributions=distributions,
                                     value=value, constraints={CONSTRAINT: over}))
    for _ in range(ASKS_PER_POINT * len(space)):
        if len(answers) == len(space):
            break
        trial = study.ask(distributions)
        point = (trial.params["level"], trial.params["micro_batch"])
        if point not in space:  # a micro-batch that level does not vary
            study.tell(trial, state=TrialState.FAIL)
            continue
        if point not in answers:
            answers[point] = evaluate(point[0], space[point])
            log.debug("refine: level %d micro-batch %d -> %.0f tok/s, %+.0f bytes over", *point, *answers[point])
        value, over = answers[point]
        trial.set_constraint(CONSTRAINT, over)
        study.tell(trial, value)
    return answers


def score(result: ProbeResult, guide: MemoryGuide) -> Score:
    """(tokens per second, peak minus the budget's limit) as the sampler reads them."""
    limit = guide.limit()
    over = result.peak_bytes - limit if math.isfinite(limit) else -1.0
    if guide.fits(result):
        return result.tokens_per_second, min(over, 0.0)
    return 0.0, max(over, 1.0)


class Refinement:
    def __init__(self, spec: SearchSpec, grid: Grid, choice: Choice, prober: Prober, guide: MemoryGuide,
                 store: ProbeStore, report: SearchReport):
        self.spec, self.grid, self.choice, self.prober = spec, grid, choice, prober
        self.guide, self.store, self.report = guide, store, report

    def fits(self, primary: List[Fit], stop: int) -> List[Fit]:
        """With --max-probes, the probes the walk left go to a sampler looking for a faster fit in the winning
        cost class, at the chosen length (levels before ``stop``, where the walk stopped). Returns the fits it found."""
        spec, grid, guide, report = self.spec, self.grid, self.guide, self.report
        if spec.options.max_probes is None or not primary or report.probe_limit_reached:
            return []
        best = self.choice.rank(primary)[0]
        cost = grid.cost_class(grid.levels[best.level])
        levels = [best.level] if cost == QUALITY else [i for i in range(stop)
                                                       if grid.cost_class(grid.levels[i]) == cost]
        space = {}
        for level in levels:
            state = grid.levels[level]
            per_rank = state.per_rank(spec.rank_batch)
            for batch in divisors(per_rank) if state.vary_batch else [per_rank]:
                space[(level, batch)] = grid.at(state, batch, best.candidate.max_length)
        known = {}
        for r in report.records:
            point = (r.level, r.candidate.micro_batch)
            if r.kind == "probe" and point in space and space[point].key() == r.candidate.key():
                known[point] = score(r.result, guide)

        def evaluate(level: int, candidate: Candidate) -> Tuple[float, float]:
            ledger = self.prober.ruled_out(level, candidate)
            if ledger is not None:
                return 0.0, ledger.low - guide.limit()
            return score(self.prober.measure(level, candidate, stage="refine"), guide)

        before = self.store.probes_run
        try:
            answers = refine(space, known, evaluate)
        except ProbeLimitReached:
            answers = None
        report.notes.append(
            f"refinement: {self.store.probes_run - before} probe(s) left under --max-probes "
            f"{spec.options.max_probes} went to "
            f"Optuna's TPE sampler over {len(space)} configurations of the {cost} class at length "
            f"{best.candidate.max_length}" + ("" if answers is not None else " (it stopped at the limit)")
        )
        return [Fit(r.level, r.candidate, r.result) for r in report.records
                if r.stage == "refine" and guide.fits(r.result)]
