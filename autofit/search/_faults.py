"""Failures that are not answers about memory: the search stops on them instead of walking the ladder.

- A **user fault** (the user's own trainer factory raised, or returned something that is not a Trainer built from
  the candidate) stops the search at once with ``FactoryError``: the same code runs for every candidate.
- **The same error on two different candidates** (outcome, phase and message alike; OOM and rejected combinations
  aside) stops it after the second: with ``FactoryError`` when it comes from a user's factory and not from the
  machine, else with ``InfrastructureError`` (the CLI's exit 4): a bad fork, a full disk, a CUDA driver that
  cannot start, a missing package, a probe killed by the host.
- A probe that **waited on a killed build's lock** (``autofit.probe._build_locks``) stops it at once with
  ``InfrastructureError``, not run again: every probe of that engine would wait its whole time limit on it.
- A **plugin fault** (another package's rung failed in its own probe-step code) stops it at once with that
  package's ``PluginError`` (exit 2): its step runs in every probe of its levels.
- A search that ends with no fit although no probe ran out of memory and the memory model ruled nothing out has
  not learnt that nothing fits: ``InfrastructureError`` too.

``classify_exception`` in ``autofit.probe._classify`` decides what a single failure is; this module only watches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterable, Optional, Tuple

from autofit.core import INFRASTRUCTURE, PLUGIN, USER, Candidate, Outcome, PluginStepError, ProbeResult, clip
from autofit.probe import STALE_LOCK_CAUSE, FactoryError
from autofit.rungs import PluginError

if TYPE_CHECKING:
    from autofit.search._result import Record

# What to do about an infrastructure cause, in one clause.
HINTS = {
    "bad-fork": "CUDA was initialized before the probe process was forked; report this with the probe log",
    "disk": "free disk space in --out and in the autofit cache (AUTOFIT_CACHE, default ~/.cache/autofit)",
    "cuda": "check the NVIDIA driver, CUDA_VISIBLE_DEVICES and that torch is a CUDA build "
            "(python -c 'import torch; print(torch.cuda.is_available())')",
    "import": "install the missing package in the environment autofit runs in",
    "signal-SIGKILL": "the host killed the probe, most often for lack of host memory",
    STALE_LOCK_CAUSE: "where no build of that op runs now, remove the lock named (rm -f it): a probe, a search or a "
                      "DeepSpeed run stopped while it built the op left it",
}
# Causes no other probe escapes: the search stops at the first, without running it again (each run waits out its
# whole time limit)
STOPS_AT_ONCE = (STALE_LOCK_CAUSE,)


class InfrastructureError(RuntimeError):
    """Probes cannot run here for a reason that is neither memory nor the candidate (CLI exit 4)."""

    def __init__(self, message: str, result: Optional[ProbeResult] = None):
        super().__init__(message)
        self.result = result


def _where(result: ProbeResult) -> str:
    parts = [f"in {result.error_phase}"] if result.error_phase else []
    if result.log_path:
        parts.append(f"log: {result.log_path}")
    return f" ({'; '.join(parts)})" if parts else ""


def factory_failure(candidate: Candidate, result: ProbeResult, repeated: bool = False) -> FactoryError:
    what = "fails the same way on two candidates" if repeated else "failed"
    frames = f"\nyour code:\n{result.detail}" if result.detail else ""
    return FactoryError(
        f"your trainer factory {what} ({candidate.describe()}): {result.error}{_where(result)}; this is not an "
        f"out-of-memory, so the search stops{frames}"
    )


def infrastructure_failure(result: ProbeResult, count: int) -> InfrastructureError:
    hint = HINTS.get(result.cause)
    seen = f"the same error on {count} different candidates" if count > 1 else "an error every probe would meet"
    return InfrastructureError(
        f"probes cannot run here: {seen}, not an out-of-memory: {result.error}{_where(result)}"
        + (f"; {hint}" if hint else ""),
        result,
    )


class FaultWatch:
    """Sees every new probe result; raises when the search must stop (see the module docstring)."""

    def __init__(self, user_factory: bool):
        self.user_factory = user_factory
        self._seen: Dict[str, Tuple[str, ProbeResult]] = {}  # error signature -> (first candidate key, result)

    def observe(self, candidate: Candidate, result: ProbeResult) -> None:
        if result.fault == USER:
            raise factory_failure(candidate, result)
        if result.fault == PLUGIN:
            said = result.error.removeprefix(f"{PluginStepError.__name__}: ")
            raise PluginError(f"{said}{_where(result)}; the search stops ({candidate.describe()})")
        if result.cause in STOPS_AT_ONCE:
            raise infrastructure_failure(result, 1)
        if result.outcome is not Outcome.CRASH:
            return  # OOM answers the question; INVALID belongs to its rung; a time-out to its candidate
        signature = result.signature()
        first = self._seen.setdefault(signature, (candidate.key(), result))
        if first[0] == candidate.key():
            return
        if self.user_factory and result.fault != INFRASTRUCTURE:
            raise factory_failure(candidate, result, repeated=True)
        raise infrastructure_failure(result, 2)


def retry_note(candidate: Candidate, first: ProbeResult, again: ProbeResult) -> str:
    """What the notes say of a probe run again after the machine failed it (a killed probe server, a signal)."""
    if again.fits:
        outcome = "fitted"
    else:
        same = again.signature() == first.signature()
        outcome = f"ended {again.outcome.value}" + (": the same error" if same else "")
    return (f"{candidate.describe()}: the probe failed for a reason that is not the candidate's "
            f"({clip(first.error, 160)}); it ran once more and {outcome}")


def check_no_fit_is_an_answer(records: Iterable[Record], skipped: bool) -> None:
    """Raise unless "nothing fits" is what the probes (or the memory model) actually showed: an out-of-memory, or the
    memory model ruling every candidate out with no probe lost to a crash or a time-out (a search stopped by
    ``--max-probes`` after one crashed probe has learnt nothing about memory)."""
    results = [record.result for record in records]
    if any(result.outcome is Outcome.OOM for result in results):
        return
    lost = (Outcome.CRASH, Outcome.TIMEOUT)
    failed = [result for result in results if not result.fits and (result.outcome in lost or not skipped)]
    if not failed:
        return
    first = failed[0]
    raise InfrastructureError(
        f"no probe ran out of memory, yet none gave a fit: {len(failed)} probe(s) failed, the first with "
        f"{first.outcome.value}: {first.error}{_where(first)}; nothing is known about what fits",
        first,
    )
