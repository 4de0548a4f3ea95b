"""The read-ahead: the walk's search for the largest value that fits, as a plan that can be read ahead. ``bisection``
is the order in which the walk (``autofit.search._walk``) probes (the model's predicted start, one above it, the top,
then bisection), and ``branches`` the values it may probe after the one it is about to, on either outcome of each
probe still to come (a k-way split where the serial walk halves). With probes side by side (``autofit.search._slots``)
``ReadAhead`` starts those on free slots, with the first probes of the levels after (``levels_after``); the walk
itself only ever follows ``bisection``, so its answer does not depend on them."""

from __future__ import annotations

from typing import Generator, List, Optional, Sequence, Tuple

from autofit.core import Candidate, SearchSpec
from autofit.memory_model import divisors
from autofit.probe import Runner
from autofit.rungs import LadderState, Rung
from autofit.search._grid import Grid
from autofit.search._guide import MemoryGuide
from autofit.search._probing import Prober
from autofit.search._pruning import pruned_levels
from autofit.search._slots import SlotRunner
from autofit.search._store import ProbeStore

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


class ReadAhead:
    """What probes side by side start on the free slots while the walk waits for its probe; nothing where the runner
    runs one probe at a time (``width`` 0)."""

    def __init__(self, spec: SearchSpec, runner: Runner, grid: Grid, rungs: Sequence[Rung], start: LadderState,
                 guide: MemoryGuide, store: ProbeStore, prober: Prober):
        self.spec, self.runner, self.grid, self.rungs, self.start = spec, runner, grid, rungs, start
        self.guide, self.store, self.prober = guide, store, prober
        self.next: List[LadderState] = []  # levels outside the ladder a pass may search next (``look_ahead_at``)

    @property
    def width(self) -> int:
        """How many probes may run at once: 0 when the runner runs one at a time (nothing is read ahead)."""
        return len(self.runner.slots.devices) if isinstance(self.runner, SlotRunner) else 0

    def look_ahead_at(self, states: List[LadderState]) -> None:
        """The levels outside the ladder a pass (the pruning's) may search next; [] when it is done."""
        self.next = states

    def start_with(self, level: int, now: Candidate, inner: List[Candidate]) -> None:
        """``now`` started, with ``inner`` (the level's candidates the walk may probe next, nearest first) and the
        first probes of the levels after it, interleaved as the walk is likely to ask for them."""
        outer = self.levels_after(level, self.width)
        nearest, later = inner[:2], inner[2:]
        self.start_ahead(now, nearest + outer[:1] + later + outer[1:])

    def levels_after(self, level: int, count: int) -> List[Candidate]:
        """Up to ``count`` probes of the levels searched after ``level`` (those a pass said it may search next, then
        the ladder's): each level's first, and what follows it on either outcome, as the walk would start them with the
        model as it stands. Probes side by side start them while this level is searched."""
        if self.spec.options.maximize == "length":
            return []
        found: List[Candidate] = []
        levels, ladder_len = self.grid.levels, self.grid.ladder_len
        after = levels[level + 1:ladder_len]
        if level < ladder_len and not self.next:  # should this level fit: the pruning pass's levels
            after = pruned_levels(levels[level], self.rungs, self.start)[:1] + after
        states = self.next + after
        for state in states:
            per_rank = state.per_rank(self.spec.rank_batch)
            values = divisors(per_rank) if state.vary_batch else [state.candidate.micro_batch]

            def make(batch: int, state: LadderState = state) -> Candidate:
                return self.grid.at(state, batch, self.spec.max_length)

            start = self.guide.predicted_start(values, make)
            found += [make(values[i]) for i in [start, *branches(start, len(values) - 1, [], start, 2)]]
            if len(found) >= count:
                break
        return found[:count]

    def start_ahead(self, now: Candidate, then: Sequence[Candidate]) -> None:
        """``now`` started on a slot, and on the free slots those of ``then`` not measured yet, not ruled out by the
        model as it stands, within ``--max-probes``."""
        runner = self.runner
        assert isinstance(runner, SlotRunner)
        steps = self.spec.options.probe_steps
        if self.store.lookup(now, "probe", steps) is not None:
            return
        left = self.spec.options.max_probes
        room = len(then) if left is None else max(0, left - self.store.probes_spent - 1)
        wanted = [c for c in then if self.store.lookup(c, "probe", steps) is None
                  and not self.grid.failed_rungs.skipped(c) and self.prober.over_at_low_end(c) is None][:room]
        runner.ahead(now, wanted, steps)
