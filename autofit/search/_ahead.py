"""The walk's search for the largest value that fits, as a plan that can be read ahead: ``bisection`` is the order
in which ``Search._largest`` probes (the model's predicted start, one above it, the top, then bisection), and
``branches`` the values it may probe after the one it is about to, on either outcome of each probe still to come
(a k-way split where the serial walk halves). Probes side by side (``autofit.search._slots``) start those on free
slots (``start_ahead``), with the first probes of the levels after (``next_levels``); the walk itself only ever
follows ``bisection``, so its answer does not depend on them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generator, List, Optional, Sequence, Tuple

from autofit.core import Candidate
from autofit.memory_model import divisors
from autofit.rungs import LadderState
from autofit.search._pruning import pruned_levels
from autofit.search._slots import SlotRunner

if TYPE_CHECKING:
    from autofit.search._search import Search

History = Sequence[Tuple[int, bool]]  # (index probed, whether it fitted), in the walk's order


def bisection(start: int, top: int) -> Generator[int, bool, None]:
    """Yields the next index to probe and is sent whether it fitted. Memory is assumed to grow with the index:
    from ``start`` (the largest index predicted to fit) up one and then to the top while it fits, else down to 0,
    then bisection between the largest fit and the smallest index that did not fit."""
    high: Optional[int]
    if (yield start):
        low, high = start, None
        if start < top:
            if (yield start + 1):
                low = start + 1
            else:
                high = start + 1
        if high is None and low < top:
            if (yield top):
                low = top
            else:
                high = top
    else:
        low, high = 0, start
        if start == 0 or not (yield 0):
            high = None
    while high is not None and high - low > 1:
        mid = (low + high) // 2
        if (yield mid):
            low = mid
        else:
            high = mid


def next_index(start: int, top: int, history: History) -> Optional[int]:
    """The index ``bisection`` probes after ``history``; None when it is done."""
    walk = bisection(start, top)
    try:
        index = next(walk)
        for probed, fitted in history:
            if probed != index:
                raise ValueError(f"history {list(history)} is not this walk's (index {index} next, not {probed})")
            index = walk.send(fitted)
    except StopIteration:
        return None
    return index


def branches(start: int, top: int, history: History, now: int, count: int) -> List[int]:
    """Up to ``count`` indices the walk may probe after ``now`` (about to be probed after ``history``), breadth
    first over the outcomes of the probes before them: the nearest first, each once, ``now`` and ``history``'s
    left out."""
    seen = {now, *(index for index, _ in history)}
    found: List[int] = []
    frontier = [list(history) + [(now, outcome)] for outcome in (True, False)]
    while frontier and len(found) < count:
        following = []
        for path in frontier:
            index = next_index(start, top, path)
            if index is None:
                continue
            if index not in seen:
                seen.add(index)
                found.append(index)
            following += [path + [(index, outcome)] for outcome in (True, False)]
        frontier = following
    return found[:count]


def next_levels(search: Search, level: int, count: int) -> List[Candidate]:
    """Up to ``count`` probes of the levels searched after ``level`` (those a pass said it may search next, then the
    ladder's): each level's first, and what follows it on either outcome, as the walk would start them with the model
    as it stands. Probes side by side start them while this level is searched."""
    if search.spec.options.maximize == "length":
        return []
    found: List[Candidate] = []
    after = search.levels[level + 1:search.ladder_len]
    if level < search.ladder_len and not search.ahead_levels:  # should this level fit: the pruning pass's levels
        after = pruned_levels(search.levels[level], search.rungs, search.start)[:1] + after
    states = search.ahead_levels + after
    for state in states:
        values = divisors(search.spec.rank_batch) if state.vary_batch else [state.candidate.micro_batch]

        def make(batch: int, state: LadderState = state) -> Candidate:
            return search._at(state, batch, search.spec.max_length)

        start = search.guide.predicted_start(values, make)
        found += [make(values[i]) for i in [start, *branches(start, len(values) - 1, [], start, 2)]]
        if len(found) >= count:
            break
    return found[:count]


def start_ahead(search: Search, now: Candidate, then: Sequence[Candidate]) -> None:
    """``now`` started on a slot, and on the free slots those of ``then`` not measured yet, not ruled out by the model
    as it stands, within ``--max-probes``."""
    runner = search.runner
    assert isinstance(runner, SlotRunner)
    steps = search.spec.options.probe_steps
    if search.store.lookup(now, "probe", steps) is not None:
        return
    left = search.spec.options.max_probes
    room = len(then) if left is None else max(0, left - search.store.probes_spent - 1)
    wanted = [c for c in then if search.store.lookup(c, "probe", steps) is None and not search.failed_rungs.skipped(c)
              and search._over_at_low_end(c) is None][:room]
    runner.ahead(now, wanted, steps)
