"""The probe worker: runs inside a fresh child process, never in the search's process.

It builds the trainer through the factory under a memory meter, trains a few optimizer steps on worst-case data,
and writes one JSON result. What a rung does in the probe is its probe step (``autofit.probe._steps``): the worker
runs the hooks of the steps the candidate makes active, and branches on no rung. Any exception is classified by
``outcome.classify_exception`` (and may be claimed by an active step as its rung's own failure); the process then
exits, so nothing an out-of-memory error leaves behind can reach the next probe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional

from autofit.core import INFRASTRUCTURE, USER, Candidate, Outcome, ProbeResult
from autofit.machine import PHASE_FILE, atomic_write_text, others_bytes, record_probe_process
from autofit.probe import _steps as steps
from autofit.probe import _virtual_checkpoint as virtual_checkpoint
from autofit.probe import kit as probe_kit
from autofit.probe._child import THREADS_ENV, build_deadline, detach_into_log, inherited_cuda
from autofit.probe._classify import BAD_FORK, CANNOT_CREATE_EXIT, classify_exception, error_origin
from autofit.probe._factory import FactoryPayload
from autofit.probe._failures import one_line, user_frames
from autofit.probe._instrument import (
    PhaseFile,
    ProbeClock,
    instrument_rl_phases,
    models_of,
    phase_callback,
)
from autofit.probe._metering import exempt_phases, make_meter, over_budget, safe_peaks, safe_stats, vllm_reserved
from autofit.probe._observe import check_trainer, config_defaults, describe_trainer, tokens_per_step
from autofit.rungs import ProbeStep

log = logging.getLogger(__name__)


def run_probe(factory: Callable, candidate: Candidate, budget_bytes: Optional[int], *, user_factory: bool = False,
              phase_path: Optional[Path] = None) -> ProbeResult:
    """Build and train; return the measured result. Runs in the probe process. ``phase_path``: a file kept holding
    the current phase's name (``instrument.PhaseFile``)."""
    phases = PhaseFile(phase_path)
    phases.write("setup")
    for key, value in candidate.env:
        os.environ[key] = value
    started = time.perf_counter()
    meter = None
    stage = "setup"
    clock = ProbeClock()
    others_start = others_bytes(candidate.device)
    active: List[ProbeStep] = []
    try:
        active = [step for step in steps.considered(candidate) if step.active(candidate)]
        if not candidate.real_weights:
            probe_kit.model_path(candidate)  # write the weightless checkpoint (once) outside the meter
        if any(step.stage == "load" for step in active):
            stage = "load"  # a step's failures belong to its rung (``failure``), not to the machine
        for step in active:
            steps.call(step, "before_build", candidate)
        meter = make_meter(candidate, budget_bytes,
                           host_aware=any(steps.call(step, "keeps_host", candidate) for step in active))
        phases.follow(meter)
        with contextlib.ExitStack() as around:
            if candidate.device == "cpu":
                around.enter_context(meter)
            handles = [steps.call(step, "around", candidate, meter, enter_into=around) for step in active]
            stage = "load"
            meter.set_phase("load")
            fill = contextlib.nullcontext() if candidate.real_weights else virtual_checkpoint.fill_on_load()
            with fill, build_deadline(candidate.probe.build_timeout_s if candidate.probe is not None else None):
                trainer = factory(candidate)
            check_trainer(trainer, candidate)
            observed = describe_trainer(trainer, candidate)
            for step in active:
                steps.call(step, "after_build", trainer, candidate, observed)
            if hasattr(meter, "track"):  # weights loaded from disk bypass the dispatch mode
                meter.track(*models_of(trainer))
            stage = "train"
            trainer.add_callback(phase_callback(meter, clock, candidate.probe))
            instrument_rl_phases(trainer, meter, clock, candidate)
            meter.set_phase("train_setup")
            trainer.train()
            host_stats: Dict = {}
            for step, handle in zip(active, handles, strict=True):
                host_stats.update(steps.call(step, "read_back", trainer, candidate, meter, handle, observed))
        peaks = {phase: peak + vllm_reserved(candidate) for phase, peak in meter.peaks().items()}
        held = {phase: peak for phase, peak in peaks.items() if phase not in exempt_phases(candidate)}
        over = over_budget(held, budget_bytes) if exempt_phases(candidate) else None
        if over is not None:
            meter.phase, error = over  # where the device would have run out, for the probe's report
            raise error
        return ProbeResult(
            Outcome.OK,
            peak_bytes=max(held.values(), default=0),
            phase_peaks=peaks,
            tokens_per_second=clock.tokens_per_second(tokens_per_step(candidate, observed)),
            steps=len(clock.step_times),
            seconds=time.perf_counter() - started,
            stats={**meter.stats(), "others_start_bytes": others_start,
                   "others_end_bytes": others_bytes(candidate.device), **host_stats},
            config_class=f"{type(trainer.args).__module__}.{type(trainer.args).__qualname__}",
            config_defaults=config_defaults(type(trainer.args), candidate.training_args()),
            generation_tokens_per_second=clock.generation_tokens_per_second(),
            observed=observed,
        )
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a classified result
        outcome, fault, cause = classify_exception(exc, stage=stage, user_factory=user_factory)
        outcome, cause = steps.claimed(active, candidate, outcome, fault, cause)  # a rung's own: not the search's
        log.error("probe ended with %s\n%s", outcome.value, "".join(traceback.format_exception(exc)))
        peaks = {phase: peak + vllm_reserved(candidate) for phase, peak in safe_peaks(meter).items()
                 if phase not in exempt_phases(candidate)}
        phase = meter.phase if meter is not None and stage != "setup" else stage
        return ProbeResult(
            outcome,
            peak_bytes=max(peaks.values(), default=0),
            phase_peaks=peaks,
            steps=len(clock.step_times),
            seconds=time.perf_counter() - started,
            error=one_line(exc),
            error_phase=phase,
            stats={**safe_stats(meter), "others_start_bytes": others_start,
                   "others_end_bytes": others_bytes(candidate.device)},
            fault=fault,
            cause=cause,
            detail=user_frames(exc) if fault == USER else "",
            origin=error_origin(exc, stage, user_factory),
        )


def child_main(factory: FactoryPayload, candidate: Candidate, budget_bytes: Optional[int], result_path: str,
               log_path: str, env: Optional[Dict[str, str]] = None):
    """Entry point of the probe process: redirect output to the probe's log, run, write the result atomically.
    ``env``: this rank's launch variables, when the probe runs several."""
    os.environ.update(env or {})
    if THREADS_ENV in os.environ:  # probes side by side share the host's cores (the forkserver's torch read its own)
        import torch

        torch.set_num_threads(int(os.environ[THREADS_ENV]))
    try:
        detach_into_log(log_path)
    except OSError:  # no room for the log: the runner names the cause (``classify_exit``)
        os._exit(CANNOT_CREATE_EXIT)
    record_probe_process(Path(log_path).parent)  # its log open: the mark of this folder's probe
    result = _main(factory, candidate, budget_bytes, Path(result_path).parent / PHASE_FILE)
    result.log_path = log_path
    atomic_write_text(Path(result_path), json.dumps(result.to_dict()))
    sys.stdout.flush()
    sys.stderr.flush()
    from multiprocessing import util

    # Release semaphores that libraries created, or the resource tracker warns about leaks (private: not in typeshed).
    util._run_finalizers()  # type: ignore[attr-defined]
    os._exit(0)  # skip interpreter teardown: a broken CUDA context can hang it


def _main(payload: FactoryPayload, candidate: Candidate, budget_bytes: Optional[int], phase_path: Path
          ) -> ProbeResult:
    inherited = inherited_cuda()
    if inherited is not None:
        log.error("probe not run, bad fork: %s", inherited)
        return ProbeResult(Outcome.CRASH, error=f"bad fork: {inherited}", error_phase="setup", fault=INFRASTRUCTURE,
                           cause=BAD_FORK)
    user_factory = not payload.builtin
    try:
        factory = payload.load()
    except BaseException as exc:  # noqa: BLE001 - the factory could not even be imported
        log.error("the trainer factory %s cannot be loaded\n%s", payload.name, "".join(traceback.format_exception(exc)))
        outcome, fault, cause = classify_exception(exc, stage="import", user_factory=user_factory)
        return ProbeResult(outcome, error=one_line(exc), error_phase="import", fault=fault, cause=cause)
    result = run_probe(factory, candidate, budget_bytes, user_factory=user_factory, phase_path=phase_path)
    if result.detail and payload.files:
        result = dataclasses.replace(result, detail=payload.named_frames(result.detail))
    return result
