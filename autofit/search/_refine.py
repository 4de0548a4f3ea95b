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
from typing import Callable, Dict, Tuple

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import TPESampler
from optuna.trial import TrialState, create_trial

from autofit.core import Candidate

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
