"""Measuring one candidate for the search: a probe or a verification through the runner and the study on disk, listed
in the report as a ``Record`` (the line each probe logs), learned from by the memory model; and the memory model's
word before a probe, a candidate ruled out (reported as a ``Skip``) when even the low end of its band is over the
budget. The walk, the read-ahead, the refinement and the choice all measure through it."""

from __future__ import annotations

import logging
from typing import Callable, Optional

from autofit import memory_model
from autofit.core import INFRASTRUCTURE, Candidate, InputError, Outcome, ProbeResult, SearchSpec, format_size
from autofit.probe import ProbeProgress, Runner
from autofit.rungs import FailedRungs
from autofit.search._faults import STOPS_AT_ONCE, FaultWatch, retry_note
from autofit.search._guide import MemoryGuide
from autofit.search._result import ProbeLimitReached, Record, SearchReport, Skip
from autofit.search._slots import SlotRunner
from autofit.search._store import ProbeStore

# The probes' lines stay under the search's logger: ``fit()`` asks it whether to draw its live line beside them.
log = logging.getLogger("autofit.search._search")


class Prober:
    def __init__(self, spec: SearchSpec, runner: Runner, progress: ProbeProgress, store: ProbeStore,
                 guide: MemoryGuide, report: SearchReport, faults: FaultWatch, failed_rungs: FailedRungs,
                 on_record: Optional[Callable[[Record], None]] = None):
        self.spec, self.runner, self.progress, self.store = spec, runner, progress, store
        self.guide, self.report, self.faults, self.failed_rungs = guide, report, faults, failed_rungs
        self.on_record = on_record

    # -- predicting -------------------------------------------------------------------------------------------
    def ruled_out(self, level: int, candidate: Candidate) -> Optional[memory_model.Ledger]:
        """The prediction (reported as a skip) when even the low end of its error band is over the budget: the
        candidate is not probed. None when it may fit, or when the model is not to be trusted with it."""
        if self.store.lookup(candidate, "probe", self.spec.options.probe_steps) is not None:
            return None  # measured already (in this run or a stored one): its answer costs nothing
        ledger = self.over_at_low_end(candidate)
        if ledger is None:
            return None
        if not any(s.candidate.key() == candidate.key() for s in self.report.skipped):
            self.report.skipped.append(Skip(level, candidate, ledger.total, ledger.uncertainty))
            log.info("skip  [%s] %s: predicted %s ± %.0f%%, over %s even at the low end",
                     "+".join(candidate.rungs) or "baseline", candidate.describe(), format_size(ledger.total),
                     100 * ledger.uncertainty, format_size(self.guide.limit()))
        return ledger

    def over_at_low_end(self, candidate: Candidate) -> Optional[memory_model.Ledger]:
        """The prediction, where even the low end of its error band is over the budget's limit."""
        if self.spec.factory is not None and self.guide.calibration is None:
            return None  # the ledger describes the built-in trainers; a custom one is trusted once measured
        ledger = self.guide.ledger(candidate)
        return ledger if ledger is not None and ledger.low > self.guide.limit() else None

    # -- measuring --------------------------------------------------------------------------------------------
    def measure(self, level: int, candidate: Candidate, kind: str = "probe", stage: str = "walk") -> ProbeResult:
        """The candidate's result (``kind``: "probe" or "verify"), from the study when it has it; raises
        ``ProbeLimitReached`` before a new probe past ``--max-probes``."""
        if kind == "verify":
            key, (steps, min_steps, cap) = self.spec.options.verify_steps, self.spec.verify_plan()
            if isinstance(self.runner, SlotRunner):
                self.runner.drain()  # a verification's timing is the one measured alone
        else:
            key, steps, min_steps, cap = self.spec.options.probe_steps, self.spec.options.probe_steps, 0, None
        limit = self.spec.options.max_probes
        if (kind == "probe" and limit is not None and self.store.lookup(candidate, kind, key) is None
                and self.store.probes_spent >= limit):  # the study's total: a resumed search counts its own
            raise ProbeLimitReached()
        predicted, prior = self.guide.predict(candidate), self.guide.predict(candidate, calibrated=False)
        calibration = self.guide.calibration.method if self.guide.calibration is not None else "prior"
        run = self.progress.around(lambda: self.runner.run(candidate, steps, min_steps=min_steps, time_cap_s=cap),
                                   len(self.report.records) + 1, level, kind, candidate, predicted,
                                   self.spec.budget_bytes)
        result, cached = self.store.measure(candidate, kind, key, level, run)
        if cached and self.guide.implausible(candidate, result):
            result, cached = self.store.measure(candidate, kind, key, level, run, fresh=True)
        if not cached and result.outcome is Outcome.CRASH and result.fault == INFRASTRUCTURE \
                and result.cause not in STOPS_AT_ONCE:  # the machine's: again
            log.info("%s", Record(level, candidate, kind, result, cached, predicted, prior).log_line(
                len(self.report.records) + 1) + "; not the candidate's failure: run once more")
            first, (result, _) = result, self.store.measure(candidate, kind, key, level, run, fresh=True)
            self.report.notes.append(retry_note(candidate, first, result))
        if not cached:
            self.faults.observe(candidate, result)
        failure_note = self.failed_rungs.observe(candidate, result)
        if failure_note:
            self.report.notes.append(failure_note)
        self.report.notes.extend(self.guide.observe(candidate, result))
        if not self.report.records and result.outcome is Outcome.INVALID and result.error_phase == "load":
            # The trainer rejected the very first configuration (TRL validates its own invariants): bad input.
            raise InputError(f"the trainer rejects this configuration: {result.error}")
        if any(r.candidate.key() == candidate.key() and r.kind == kind for r in self.report.records):
            return result  # already measured and listed in this run (the same point reached from another level)
        record = Record(level, candidate, kind, result, cached, predicted, prior,
                        "verify" if kind == "verify" else stage, calibration)
        self.report.records.append(record)
        if kind == "probe":
            self.guide.learn(result)
        log.info("%s", record.log_line(len(self.report.records)))
        if self.on_record is not None:
            self.on_record(record)
        return result
