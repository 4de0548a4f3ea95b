"""The compared methods, each driven through autofit's public interfaces.

(a) ``autofit``: ``Search(spec, runner, resolve_ladder(None)).run()`` as built, its runner wrapped to count probes.
(b) ``auto_find_batch_size``: transformers' own finder, really run (see ``benchmarks.auto_batch``).
(c) ``doubling``: micro-batch 1, 2, 4, ... until the first OOM, then bisection in between (Lightning's batch-size
    finder in ``binsearch`` mode, autovram); the baseline configuration otherwise, micro-batch over the divisors
    of the effective batch, gradient accumulation = effective / micro-batch.
(d) ``decay``: start at the effective batch, multiply by 0.9 on each OOM, rounded down and then down to a divisor of
    the effective batch (accelerate's ``find_executable_batch_size``, with the effective batch kept).
(e) ``grid``: every ladder level of ``Search(...).levels`` x every divisor micro-batch, the oracle: the fastest fit
    of the cheapest cost class that has one (in the quality class, the fastest fit of the first level that fits),
    the rule autofit itself follows.

(a) at an older commit, run from its own checkout, is ``benchmarks.search_speed``'s: the answer's verified
throughput as a share of the best fit's, and the candidates timed, old code against new (issue 37, item 3).

Every probe of (a), (c), (d) and (e) is a real TRL training in a fresh process through ``ProcessRunner``.
Methods that do not verify their choice themselves get one 10-step verification probe under the same budget; a
verification of the same configuration under the same budget is shared between methods (the same measurement), so
equal choices get equal numbers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from autofit.core import RL_ALGOS, Candidate, Outcome, ProbeResult, SearchOptions, SearchSpec, algorithm, format_size
from autofit.probe import ProcessRunner
from autofit.rungs import FREE, QUALITY, SPEED, resolve_ladder
from autofit.search import Search, divisors

PROBE_STEPS = 2  # autofit's default probe length, used by every method's probes
VERIFY_STEPS = 10  # autofit's default verification length, used for every method's chosen configuration
PROBE_TIMEOUT_S = 600.0

Log = Callable[[str], None]


@dataclass(frozen=True)
class Workload:
    """One model/algorithm/length setting; its budgets are fractions of its measured baseline peak."""

    name: str
    model: str
    algo: str
    max_length: int
    effective_batch: int = 8
    num_generations: Optional[int] = None
    prompt_length: Optional[int] = None
    budgets: tuple = (("generous", 1.25), ("tight", 0.60))

    @property
    def factory(self) -> str:
        return algorithm(self.algo).factory

    def spec(self, budget_bytes: int, out_dir: Path, max_probes: Optional[int] = None) -> SearchSpec:
        extra: Dict[str, Any] = {}
        if self.num_generations is not None:
            extra["num_generations"] = self.num_generations
        if self.prompt_length is not None:
            extra["max_prompt_length"] = self.prompt_length
        length = "max_completion_length" if self.algo in RL_ALGOS else "max_length"
        options = SearchOptions(model=self.model, algo=self.algo, device="cpu", gpu_memory=budget_bytes,
                                effective_batch=self.effective_batch, out_dir=out_dir, probe_steps=PROBE_STEPS,
                                verify_steps=VERIFY_STEPS, probe_timeout_s=PROBE_TIMEOUT_S, max_probes=max_probes,
                                **{length: self.max_length}, **extra)
        return SearchSpec.plan(options, device="cpu", gpu_bytes=budget_bytes)


@dataclass
class Call:
    candidate: Candidate
    steps: int
    result: ProbeResult
    seconds: float


class CountingRunner:
    """Delegates to a ``ProcessRunner``; counts the probes it runs and times each one."""

    def __init__(self, inner: ProcessRunner, label: str, log: Log):
        self.inner = inner
        self.label = label
        self.log = log
        self.calls: List[Call] = []

    def run(self, candidate: Candidate, steps: int, **plan) -> ProbeResult:
        started = time.perf_counter()
        result = self.inner.run(candidate, steps)
        seconds = time.perf_counter() - started
        self.calls.append(Call(candidate, steps, result, seconds))
        self.log(f"  {self.label} #{len(self.calls)} {describe(candidate)} x{steps}: {probe_line(result)} "
                 f"({seconds:.1f} s)")
        return result

    def __getattr__(self, name):  # anything else the search may ask of its runner
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def count(self) -> int:
        return len(self.calls)

    @property
    def seconds(self) -> float:
        return sum(call.seconds for call in self.calls)


def describe(candidate: Candidate) -> str:
    rungs = "+".join(candidate.rungs) or "baseline"
    return f"{candidate.describe()} [{rungs}]"


def probe_line(result: ProbeResult) -> str:
    text = f"{result.outcome.value} peak {format_size(result.peak_bytes)}"
    if result.fits:
        text += f", {result.tokens_per_second:,.0f} tok/s"
    elif result.outcome is not Outcome.OOM:
        text += f": {result.error[:120]}"
    return text


@dataclass
class Verification:
    result: ProbeResult
    seconds: float
    by: str  # the method whose run produced it


class Verifier:
    """10-step verification probes of chosen configurations under one budget, shared between methods."""

    def __init__(self, workload: Workload, budget_bytes: int, workdir: Path, log: Log):
        self.runner = CountingRunner(ProcessRunner(workload.factory, budget_bytes, workdir, PROBE_TIMEOUT_S),
                                     "verify", log)
        self.done: Dict[str, Verification] = {}

    def record(self, candidate: Candidate, result: ProbeResult, seconds: float, by: str) -> None:
        self.done.setdefault(candidate.key(), Verification(result, seconds, by))

    def verify(self, candidate: Candidate, by: str) -> Verification:
        key = candidate.key()
        if key not in self.done:
            result = self.runner.run(candidate, VERIFY_STEPS)
            self.done[key] = Verification(result, self.runner.calls[-1].seconds, by)
        return self.done[key]


@dataclass
class MethodResult:
    method: str
    status: str  # "found", "not found", "refused", "failed"
    probes: int = 0  # probes (fresh training processes) to a verified configuration, verification included
    wall_s: float = 0.0  # wall time to a verified configuration
    candidate: Optional[Candidate] = None
    chosen: str = "-"
    rungs: List[str] = field(default_factory=list)
    effective_batch: Optional[int] = None
    verified_ok: Optional[bool] = None
    verified_peak: int = 0
    verified_tps: float = 0.0
    verified_by: str = ""
    note: str = ""
    detail: dict = field(default_factory=dict)

    def set_verification(self, verification: Verification, own: bool) -> None:
        result = verification.result
        self.verified_ok = result.fits
        self.verified_peak = result.peak_bytes
        self.verified_tps = result.tokens_per_second
        self.verified_by = "own" if own else verification.by
        if not own:
            self.probes += 1
            self.wall_s += verification.seconds


def levels_of(workload: Workload, budget_bytes: int, scratch: Path, log: Log):
    """The ladder levels autofit would walk (Search(...).levels), built without running anything."""
    spec = workload.spec(budget_bytes, scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    runner = CountingRunner(ProcessRunner(workload.factory, budget_bytes, scratch), "levels", log)
    return Search(spec, runner, resolve_ladder(None)).levels


# -- (a) autofit ------------------------------------------------------------------------------------------------------
def run_autofit(workload: Workload, budget: int, workdir: Path, verifier: Verifier, log: Log,
                max_probes: Optional[int] = None) -> MethodResult:
    """autofit as built; with ``max_probes``, the same search whose unused probes go to the Optuna refinement."""
    spec = workload.spec(budget, workdir, max_probes)  # SearchSpec and its options are frozen: set when built
    name = "autofit" if max_probes is None else "autofit-refine"
    workdir.mkdir(parents=True, exist_ok=True)
    runner = CountingRunner(ProcessRunner(workload.factory, budget, workdir, PROBE_TIMEOUT_S), name, log)
    started = time.perf_counter()
    report = Search(spec, runner, resolve_ladder(None)).run()
    wall = time.perf_counter() - started
    for call in runner.calls:
        if call.steps == VERIFY_STEPS:
            verifier.record(call.candidate, call.result, call.seconds, name)
    out = MethodResult(name, "found" if report.chosen is not None else "not found", probes=runner.count,
                       wall_s=wall)
    out.detail = {
        "probes_run": report.probes_run,
        "records": [
            {"kind": r.kind, "level": r.level, "candidate": describe(r.candidate), "outcome": r.result.outcome.value,
             "peak_bytes": r.result.peak_bytes, "tokens_per_second": r.result.tokens_per_second, "cached": r.cached,
             "predicted_bytes": r.predicted_bytes, "prior_bytes": r.prior_bytes, "calibrated": r.calibrated,
             "calibration": r.calibration, "stage": r.stage}
            for r in report.records
        ],
        "skipped": [{"level": s.level, "candidate": describe(s.candidate), "predicted_bytes": s.predicted_bytes,
                     "uncertainty": s.uncertainty} for s in report.skipped],
        "margin": report.margin,
        "notes": list(report.notes),
        # not timed: predicted slower than a measured fit (issue 37; benchmarks.search_speed compares old and new)
        "speed_skipped": [describe(s.candidate) for s in getattr(report, "speed_skipped", [])],
    }
    if report.probes_run != runner.count:
        out.note = f"report.probes_run={report.probes_run} but the runner ran {runner.count} probes"
    if report.chosen is None:
        out.note = (out.note + "; " if out.note else "") + "nothing fits even at the last rung"
        return out
    out.candidate = report.chosen.candidate
    out.chosen = describe(out.candidate)
    out.rungs = list(out.candidate.rungs)
    out.effective_batch = out.candidate.effective_batch
    verified = report.verified
    own = Verification(verified, 0.0, name)
    out.set_verification(own, own=True)
    return out


# -- (b) auto_find_batch_size ------------------------------------------------------------------------------------------
def run_auto_find(workload: Workload, budget: int, workdir: Path, log: Log) -> MethodResult:
    from benchmarks.auto_batch import run_in_fresh_process

    job = {
        "factory": workload.factory, "algo": workload.algo, "model": workload.model,
        "effective_batch": workload.effective_batch, "max_length": workload.max_length,
        "num_generations": workload.num_generations, "prompt_length": workload.prompt_length,
        "steps": VERIFY_STEPS, "output_dir": str(workdir / "trainer"), "budget_bytes": budget,
    }
    res = run_in_fresh_process(job, workdir, PROBE_TIMEOUT_S)
    attempts = res.get("attempts", [])
    trail = " -> ".join(f"{a['batch']} {a['outcome']}" for a in attempts)
    log(f"  auto_find_batch_size: {res['status']} {trail} {res.get('error', '')[:160]} ({res['wall_s']:.1f} s)")
    out = MethodResult("auto_find_batch_size", res["status"], probes=1, wall_s=res["wall_s"], detail=res)
    if res["status"] == "refused":
        out.probes = 0
        out.note = res["error"]
        return out
    if res["status"] != "finished":
        out.status = "not found"
        out.note = res.get("error", "")
        out.verified_ok = False
        return out
    out.status = "found"
    out.effective_batch = res["effective_batch"]
    out.chosen = (f"mb={res['batch']}x{res['grad_accum']} len={workload.max_length} "
                  f"(effective batch {res['effective_batch']}, not {workload.effective_batch})"
                  if res["effective_batch"] != workload.effective_batch else
                  f"mb={res['batch']}x{res['grad_accum']} len={workload.max_length}")
    out.verified_ok = True  # it trained its VERIFY_STEPS steps under the budget at that batch
    out.verified_peak = res["peak_bytes"]
    out.verified_tps = res["tokens_per_second"]
    out.verified_by = "own"
    out.note = f"batches tried: {trail}"
    return out


# -- (c) doubling then bisection, (d) decay --------------------------------------------------------------------------
def _batch_runner(workload: Workload, budget: int, workdir: Path, label: str, base: Candidate, log: Log):
    runner = CountingRunner(ProcessRunner(workload.factory, budget, workdir, PROBE_TIMEOUT_S), label, log)
    effective = workload.effective_batch

    def at(batch: int) -> Candidate:
        return base.replace(micro_batch=batch, grad_accum=effective // batch)

    return runner, at


def run_doubling(workload: Workload, budget: int, workdir: Path, base: Candidate, verifier: Verifier,
                 log: Log) -> MethodResult:
    runner, at = _batch_runner(workload, budget, workdir, "doubling", base, log)
    values = divisors(workload.effective_batch)
    started = time.perf_counter()
    fits: Dict[int, bool] = {}

    def fits_at(index: int) -> bool:
        if index not in fits:
            fits[index] = runner.run(at(values[index]), PROBE_STEPS).fits
        return fits[index]

    best, failed = None, None
    index = 0
    while index < len(values):  # doubling: 1, 2, 4, ... (the next divisor at least twice as large)
        if not fits_at(index):
            failed = index
            break
        best = index
        doubled = [i for i, v in enumerate(values) if v >= 2 * values[index]]
        if not doubled:
            break
        index = doubled[0]
    if best is not None and failed is not None:  # bisection between the last fit and the first OOM
        low, high = best, failed
        while high - low > 1:
            mid = (low + high) // 2
            if fits_at(mid):
                low = mid
            else:
                high = mid
        best = low
    return _finish("doubling", runner, started, None if best is None else at(values[best]), verifier,
                   f"micro-batch {values[0]} does not fit, so doubling stops there")


def run_decay(workload: Workload, budget: int, workdir: Path, base: Candidate, verifier: Verifier,
              log: Log) -> MethodResult:
    runner, at = _batch_runner(workload, budget, workdir, "decay", base, log)
    values = divisors(workload.effective_batch)
    started = time.perf_counter()
    batch, chosen = workload.effective_batch, None
    while batch >= 1:
        if runner.run(at(batch), PROBE_STEPS).fits:
            chosen = at(batch)
            break
        lower = [v for v in values if v <= int(batch * 0.9)]
        batch = lower[-1] if lower else 0
    return _finish("decay", runner, started, chosen, verifier, "no micro-batch fits, down to 1")


def _finish(method: str, runner: CountingRunner, started: float, chosen: Optional[Candidate],
            verifier: Verifier, none_found: str) -> MethodResult:
    out = MethodResult(method, "found" if chosen else "not found", probes=runner.count,
                       wall_s=time.perf_counter() - started)
    failures = [c for c in runner.calls if c.result.outcome not in (Outcome.OK, Outcome.OOM)]
    if failures:
        out.note = f"{len(failures)} probe(s) failed otherwise: {failures[0].result.error[:120]}"
    if chosen is None:
        out.note = out.note or f"{none_found} (only the micro-batch of the baseline configuration is searched)"
        return out
    out.candidate = chosen
    out.chosen = describe(chosen)
    out.effective_batch = chosen.effective_batch
    out.set_verification(verifier.verify(chosen, method), own=False)
    return out


# -- (e) the exhaustive grid ------------------------------------------------------------------------------------------
@dataclass
class GridPoint:
    level: int
    cost: str
    candidate: Candidate
    result: ProbeResult
    seconds: float


def grid_space(workload: Workload, levels) -> List[tuple]:
    """(level index, cost, candidate) for every level x every divisor micro-batch, each configuration once
    (at the first level that reaches it)."""
    effective = workload.effective_batch
    seen, space = set(), []
    for index, state in enumerate(levels):
        for batch in divisors(effective) if state.vary_batch else [effective]:
            candidate = state.candidate.replace(micro_batch=batch, grad_accum=effective // batch,
                                                max_length=workload.max_length)
            if candidate.key() not in seen:
                seen.add(candidate.key())
                space.append((index, state.cost, candidate))
    return space


def run_grid(workload: Workload, levels, workdir: Path, log: Log,
             budgets_for: Callable[[int], List[int]]) -> List[GridPoint]:
    """The grid, probed without a budget. Under the simulated meter a configuration fits a budget exactly when its
    unbounded peak is within it (the meter raises as soon as live bytes exceed the budget, and the allocations do
    not depend on the budget), so one grid serves every budget of the group.

    Levels are probed in ladder order, and the grid stops where the rest cannot change the oracle's answer for any
    of the group's budgets (``budgets_for(baseline peak)``): at the end of a cost class once every budget has a fit,
    and, in the quality class, after the first level where every budget has one."""
    runner = CountingRunner(ProcessRunner(workload.factory, None, workdir, PROBE_TIMEOUT_S), "grid", log)
    points: List[GridPoint] = []
    budgets: List[int] = []
    for index, cost, candidate in grid_space(workload, levels):
        if points and index != points[-1].level:
            previous = points[-1].cost
            if (cost != previous or previous == QUALITY) and all(
                any(grid_fits(p, budget) for p in points) for budget in budgets
            ):
                break
        result = runner.run(candidate, PROBE_STEPS)
        points.append(GridPoint(index, cost, candidate, result, runner.calls[-1].seconds))
        if len(points) == 1:
            if not result.fits:
                raise RuntimeError(f"the unbounded baseline probe failed: {result.error}")
            budgets = budgets_for(result.peak_bytes)
    return points


def grid_fits(point: GridPoint, budget: int) -> bool:
    return point.result.fits and point.result.peak_bytes <= budget


ORACLE_VERIFIED = 3  # the oracle verifies this many of its fastest fits and keeps the fastest verified one


def oracle_candidates(points: List[GridPoint], budget: int) -> List[GridPoint]:
    """The fits the oracle's rule chooses among (the cheapest cost class with a fit; in the quality class, the
    first level with one), fastest first by probe throughput."""
    for cost in (FREE, SPEED, QUALITY):
        fits = [p for p in points if p.cost == cost and grid_fits(p, budget)]
        if not fits:
            continue
        if cost == QUALITY:
            first = min(p.level for p in fits)
            fits = [p for p in fits if p.level == first]
        return sorted(fits, key=lambda p: p.result.tokens_per_second, reverse=True)
    return []


def run_oracle(points: List[GridPoint], budget: int, verifier: Verifier) -> MethodResult:
    """The oracle's answer: of its ORACLE_VERIFIED fastest fits by probe throughput (one timed step each, noisy on
    a CPU), the fastest in a 10-step verification."""
    out = MethodResult("grid (oracle)", "not found", probes=len(points), wall_s=sum(p.seconds for p in points))
    out.note = "grid probed once per model group without a budget, shared by its budgets"
    best = None
    for point in oracle_candidates(points, budget)[:ORACLE_VERIFIED]:
        verification = verifier.verify(point.candidate, "grid (oracle)")
        out.probes += 1
        out.wall_s += verification.seconds
        if verification.result.fits and (best is None or verification.result.tokens_per_second
                                         > best[1].result.tokens_per_second):
            best = (point, verification)
    if best is None:
        return out
    point, verification = best
    out.status = "found"
    out.candidate = point.candidate
    out.chosen = describe(point.candidate)
    out.rungs = list(point.candidate.rungs)
    out.effective_batch = point.candidate.effective_batch
    out.set_verification(verification, own=True)  # counted above
    out.verified_by = "grid (oracle)"
    return out
