"""Runs each probe in a fresh process and turns whatever happens to it into a ``ProbeResult``.

Probe processes are forked from a multiprocessing *forkserver* that has imported torch, transformers, trl and
peft once but never touched CUDA: each probe is still a new process (its own CUDA context, allocator and peak
statistics, nothing left over from an earlier OOM), without paying several seconds of imports every time.
A probe that hangs is killed at its timeout; one that dies is reported as a crash; the search goes on.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from pathlib import Path
from typing import Optional, Protocol

from autofit.candidate import Candidate, ProbeSettings
from autofit.outcome import ProbeResult, classify_exit

log = logging.getLogger(__name__)

PRELOAD = ["autofit.preload"]


class Runner(Protocol):
    """Anything that measures one candidate. The search only ever talks to this."""

    def run(self, candidate: Candidate, steps: int) -> ProbeResult: ...


class ProcessRunner:
    def __init__(self, factory_ref: str, budget_bytes: Optional[int], workdir: Path, timeout_s: float = 900.0):
        self.factory_ref = factory_ref
        self.budget_bytes = budget_bytes
        self.workdir = Path(workdir)
        self.timeout_s = timeout_s
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)
        self._count = 0

    def run(self, candidate: Candidate, steps: int) -> ProbeResult:
        from autofit.worker import child_main

        self._count += 1
        probe_dir = self.workdir / "probes" / f"{candidate.key()}-{steps}"
        probe_dir.mkdir(parents=True, exist_ok=True)
        result_path = probe_dir / "result.json"
        result_path.unlink(missing_ok=True)
        candidate = candidate.replace(probe=ProbeSettings(steps=steps, output_dir=str(probe_dir / "trainer")))
        process = self._context.Process(
            target=child_main,
            args=(self.factory_ref, candidate, self.budget_bytes, str(result_path), str(probe_dir / "probe.log")),
            name=f"autofit-probe-{self._count}",
        )
        process.start()
        try:
            process.join(self.timeout_s)
            timed_out = process.is_alive()
            if timed_out:
                process.kill()
                process.join()
        except BaseException:  # interrupted: take the probe down with us
            process.kill()
            process.join()
            raise
        if result_path.exists():
            return ProbeResult.from_dict(json.loads(result_path.read_text()))
        result = classify_exit(process.exitcode, timed_out)
        result.error += f" (log: {probe_dir / 'probe.log'})"
        return result


def preload_modules() -> None:
    """Imported by the forkserver: the heavy libraries, without initializing CUDA."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import importlib

    for name in ("torch", "transformers", "trl", "peft", "datasets", "autofit.worker"):
        try:
            importlib.import_module(name)
        except ImportError as exc:  # the probe will report it properly
            log.debug("preload of %s failed: %s", name, exc)
