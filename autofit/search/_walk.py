"""The walk of the ladder: levels from free to costly, at each the largest micro-batch (or the longest sequence) that
fits, until a cost class has fits (the rules are in ``autofit.search._search``'s opening). A level is searched by
``bisection`` (``autofit.search._ahead``) from the memory model's predicted start; what the model rules out is not
probed, what the throughput model predicts slower is not timed (``autofit.search._speed_skip``), and probes side by
side read the walk's next probes ahead."""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

from autofit.core import Candidate, SearchSpec
from autofit.memory_model import divisors, length_grid
from autofit.rungs import QUALITY, FailedRungs, LadderState
from autofit.search._ahead import ReadAhead, bisection, branches
from autofit.search._grid import Grid
from autofit.search._guide import MemoryGuide
from autofit.search._probing import Prober
from autofit.search._result import Fit, ProbeLimitReached, SearchReport
from autofit.search._speed_skip import SpeedGate


class Walk:
    def __init__(self, spec: SearchSpec, grid: Grid, prober: Prober, ahead: ReadAhead, guide: MemoryGuide,
                 speed: SpeedGate, failed_rungs: FailedRungs, report: SearchReport):
        self.spec, self.grid, self.prober, self.ahead, self.guide = spec, grid, prober, ahead, guide
        self.speed, self.failed_rungs, self.report = speed, failed_rungs, report

    def run(self, start: int) -> Tuple[List[Fit], List[Fit], int]:
        """Visit levels from ``start`` until a cost class has fits; returns (primary, fallback, next level)."""
        primary: List[Fit] = []  # the best fit of each level
        fallback: List[Fit] = []  # smaller fits, in case a verification fails
        cost = None
        grid = self.grid
        self.speed.compare([], None)  # no measured fit to compare with yet (``_speed_skip``)
        for level in range(start, grid.ladder_len):
            state = grid.levels[level]
            if cost is not None and (grid.cost_class(state) != cost or cost == QUALITY
                                     or any(map(grid.at_top, primary))):
                return primary, fallback, level
            try:
                fits = self.search_level(level, state)
            except ProbeLimitReached:
                self.report.probe_limit_reached = True
                self.report.notes.append(f"--max-probes {self.spec.options.max_probes} reached: the search stopped "
                                         "there")
                fits = [f for f in self.fits_so_far(level) if f not in primary + fallback]
                if fits:
                    primary.append(fits[0])
                    fallback.extend(fits[1:])
                return primary, fallback, grid.ladder_len
            if fits:
                cost = cost or grid.cost_class(state)
                primary.append(fits[0])
                fallback.extend(fits[1:])
                self.speed.compare(primary + fallback, cost)
        return primary, fallback, grid.ladder_len

    def search_level(self, level: int, state: LadderState) -> List[Fit]:
        """The fits found at one level, the largest first (a pass rebuilding a level searches it the same way)."""
        spec = self.spec
        per_rank = state.per_rank(spec.rank_batch)
        batches = divisors(per_rank) if state.vary_batch else [state.candidate.micro_batch]  # the level's own

        def at(batch: int, length: int) -> Candidate:
            return self.grid.at(state, batch, length)

        if spec.options.maximize == "length":
            grid = length_grid(spec.min_length, spec.max_length)
            return self.largest(level, grid, lambda length: at(batches[0], length))
        fits = self.largest(level, batches, lambda batch: at(batch, spec.max_length), top_apart=True)
        if not fits and state.vary_length:
            shorter = length_grid(spec.min_length, spec.max_length)[:-1]
            by_length = self.largest(level, shorter, lambda length: at(batches[0], length))
            if by_length:
                length = by_length[0].candidate.max_length
                fits = self.largest(level, batches, lambda batch: at(batch, length), top_apart=True) + by_length[1:]
        return fits

    def largest(self, level: int, values: Sequence[int], make: Callable[[int], Candidate],
                top_apart: bool = False) -> List[Fit]:
        """The largest value that fits, memory assumed to grow with the value. Returns every fit found, the
        largest first.

        The memory model picks the first probe: the largest value predicted to fit. If it fits, the next value is
        probed to confirm it is the largest (climbing on if that fits too); else the values below it are bisected.
        When memory grows with the value the answer is plain bisection's and the model only saves probes.

        ``top_apart``: the top value is the micro-batch without accumulation, which memory does not order with the
        others (from accumulation 2 on, gradients stay resident between micro-batches, so at short sequences
        micro-batch 1 can need more than the full batch). With the model, the top is then tried whenever the
        search did not reach it, unless the model rules it out."""
        fits: List[Fit] = []
        tried = set()
        history: List[Tuple[int, bool]] = []
        top = len(values) - 1
        start = self.guide.predicted_start(values, make)

        def fits_at(index: int) -> bool:
            tried.add(index)
            candidate = make(values[index])
            if self.prober.ruled_out(level, candidate) is not None or self.failed_rungs.skipped(candidate):
                return False
            if self.speed.skips(level, candidate):  # not timed, predicted slower: a larger value may be faster
                return True
            width = self.ahead.width
            if width:
                inner = branches(start, top, history, index, width)
                if top_apart and self.guide.shape is not None and top not in tried | set(inner):
                    inner.append(top)
                self.ahead.start_with(level, candidate, [make(values[i]) for i in inner])
            result = self.prober.measure(level, candidate)
            if self.guide.fits(result):
                fits.append(Fit(level, candidate, result))
                return True
            return False

        walk = bisection(start, top)
        try:
            index = next(walk)
            while True:
                fitted = fits_at(index)
                history.append((index, fitted))
                index = walk.send(fitted)
        except StopIteration:
            pass
        if top_apart and self.guide.shape is not None and top not in tried:
            fits_at(top)
        return sorted(fits, key=lambda f: self.grid.size(f.candidate), reverse=True)

    def fits_so_far(self, level: int) -> List[Fit]:
        """The level's measured fits, the largest first (what the walk keeps when the probe limit stops it)."""
        return sorted((Fit(level, r.candidate, r.result) for r in self.report.records if r.level == level
                       and r.kind == "probe" and self.guide.fits(r.result)), key=lambda f: self.grid.size(f.candidate),
                      reverse=True)
