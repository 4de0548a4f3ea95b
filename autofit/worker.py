"""The probe worker: runs inside a fresh child process, never in the search's process.

It builds the trainer through the factory under a memory meter, trains a few optimizer steps on worst-case data,
and writes one JSON result. Any exception is classified by ``outcome.classify_exception``; the process then exits,
so nothing an out-of-memory error leaves behind can reach the next probe.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional

from autofit import probe_kit
from autofit.candidate import Candidate
from autofit.outcome import Outcome, ProbeResult, classify_exception

log = logging.getLogger(__name__)


def make_meter(candidate: Candidate, budget_bytes: Optional[int]):
    if candidate.device == "cpu":
        from autofit.meters import SimulatedMeter

        return SimulatedMeter(budget_bytes)
    from autofit.meters import CudaMeter

    return CudaMeter(budget_bytes)


def _phase_callback(meter, step_times: List[float]):
    from transformers import TrainerCallback

    class PhaseCallback(TrainerCallback):
        """Names the phases of each optimizer step for the meter and times the steps. PPO's own loop calls only
        on_train_begin and on_step_end, so a step is timed from the previous mark."""

        def on_train_begin(self, args, state, control, **kwargs):
            self._mark = time.perf_counter()

        def on_step_begin(self, args, state, control, **kwargs):
            meter.set_phase("forward_backward")
            self._mark = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            meter.set_phase("optimizer_step")

        def on_step_end(self, args, state, control, **kwargs):
            _synchronize(args)
            now = time.perf_counter()
            step_times.append(now - self._mark)
            self._mark = now
            meter.set_phase("between_steps")

    return PhaseCallback()


def _wrap(owner, name: str, before: Optional[str], after: Optional[str], meter) -> None:
    """Replace ``owner.name`` with a call that switches the meter's phase before and after it."""
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if before:
            meter.set_phase(before)
        out = original(*args, **kwargs)
        if after:
            meter.set_phase(after)
        return out

    setattr(owner, name, wrapped)


def _models_of(trainer) -> List:
    """Every model the trainer holds: the policy, and the reference, reward or value models of RL trainers."""
    import torch

    found = []
    for value in vars(trainer).values():
        items = value if isinstance(value, (list, tuple)) else [value]
        found.extend(item for item in items if isinstance(item, torch.nn.Module))
    return found


def _instrument_rl_phases(trainer, meter) -> None:
    """Online RL trainers generate inside the training step: name those phases for the meter.
    generation: the completions (KV cache); scoring: rewards plus the old/reference/value passes."""
    if hasattr(trainer, "_generate") and hasattr(trainer, "_generate_and_score_completions"):  # GRPO, RLOO
        _wrap(trainer, "_generate", "generation", "scoring", meter)
        _wrap(trainer, "_generate_and_score_completions", None, "forward_backward", meter)
    elif hasattr(trainer, "policy_model") and hasattr(trainer, "value_model"):  # PPO's own loop
        _wrap(trainer.policy_model, "generate", "generation", "scoring", meter)
        _wrap(trainer.model, "forward", "forward_backward", None, meter)
        _wrap(trainer.optimizer, "step", "optimizer_step", "forward_backward", meter)


def _synchronize(args) -> None:
    import torch

    if not getattr(args, "use_cpu", False) and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def run_probe(factory: Callable, candidate: Candidate, budget_bytes: Optional[int]) -> ProbeResult:
    """Build and train; return the measured result. Runs in the probe process."""
    for key, value in candidate.env:
        os.environ[key] = value
    started = time.perf_counter()
    meter = None
    step_times: List[float] = []
    try:
        if not candidate.real_weights:
            probe_kit.model_path(candidate)  # write the random-weight checkpoint (once) outside the meter
        meter = make_meter(candidate, budget_bytes)
        context = meter if candidate.device == "cpu" else contextlib.nullcontext()
        with context:
            meter.set_phase("load")
            trainer = factory(candidate)
            _check_trainer(trainer, candidate)
            if hasattr(meter, "track"):  # weights loaded from disk bypass the dispatch mode
                meter.track(*_models_of(trainer))
            trainer.add_callback(_phase_callback(meter, step_times))
            _instrument_rl_phases(trainer, meter)
            meter.set_phase("train_setup")
            trainer.train()
        peaks = meter.peaks()
        steps = len(step_times)
        timed = step_times[1:] or step_times  # the first step includes warm-up (lazy optimizer state, kernels)
        seconds_per_step = sum(timed) / len(timed) if timed else 0.0
        return ProbeResult(
            Outcome.OK,
            peak_bytes=max(peaks.values(), default=0),
            phase_peaks=peaks,
            tokens_per_second=candidate.tokens_per_step / seconds_per_step if seconds_per_step else 0.0,
            steps=steps,
            seconds=time.perf_counter() - started,
            stats=meter.stats(),
            config_class=f"{type(trainer.args).__module__}.{type(trainer.args).__qualname__}",
            config_defaults=config_defaults(type(trainer.args), candidate.training_args()),
        )
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a classified result
        outcome = classify_exception(exc)
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:500]
        log.error("probe ended with %s\n%s", outcome.value, "".join(traceback.format_exception(exc)))
        peaks = _safe_peaks(meter)
        phase = meter.phase if meter is not None else "setup"
        return ProbeResult(
            outcome,
            peak_bytes=max(peaks.values(), default=0),
            phase_peaks=peaks,
            steps=len(step_times),
            seconds=time.perf_counter() - started,
            error=message,
            error_phase=phase,
            stats=_safe_stats(meter),
        )


def _check_trainer(trainer, candidate: Candidate) -> None:
    """A factory must use the candidate's settings, or the probe measures something else."""
    args = trainer.args
    expected = candidate.training_args()
    wrong = {
        key: (getattr(args, key, None), value)
        for key, value in expected.items()
        if key in ("per_device_train_batch_size", "gradient_accumulation_steps", "max_steps")
        and getattr(args, key, None) != value
    }
    if wrong:
        raise ValueError(
            "the trainer factory ignored the candidate's settings "
            + ", ".join(f"{k}={got!r} (expected {want!r})" for k, (got, want) in wrong.items())
            + ": build the config with candidate.training_args()"
        )


def config_defaults(config_class, keys) -> Dict:
    """The config class's own defaults for ``keys``, so the export writes only what differs from them."""
    import dataclasses

    defaults = {}
    for item in dataclasses.fields(config_class):
        if item.name not in keys:
            continue
        if item.default is not dataclasses.MISSING:
            value = item.default
        elif item.default_factory is not dataclasses.MISSING:
            value = item.default_factory()
        else:
            continue
        defaults[item.name] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
    return defaults


def _safe_peaks(meter) -> Dict[str, int]:
    try:
        return meter.peaks() if meter is not None else {}
    except Exception:  # a broken CUDA context cannot be read any more
        return {}


def _safe_stats(meter) -> Dict:
    try:
        return meter.stats() if meter is not None else {}
    except Exception:
        return {}


def detach_into_log(log_path: str) -> None:
    """Make this process a quiet child: its output goes to ``log_path``, and Ctrl-C (which reaches the whole
    process group) is left to the parent, which alone decides and kills it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)


def child_main(factory_ref: str, candidate: Candidate, budget_bytes: Optional[int], result_path: str, log_path: str):
    """Entry point of the probe process: redirect output to the probe's log, run, write the result atomically."""
    detach_into_log(log_path)
    from autofit.factory import load_factory

    try:
        factory = load_factory(factory_ref)
        result = run_probe(factory, candidate, budget_bytes)
    except BaseException as exc:  # noqa: BLE001 - the factory could not even be imported
        result = ProbeResult(classify_exception(exc), error=f"{type(exc).__name__}: {exc}"[:500], error_phase="import")
    tmp = result_path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result.to_dict(), handle)
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    from multiprocessing import util

    util._run_finalizers()  # release semaphores that libraries created, or the resource tracker warns about leaks
    os._exit(0)  # skip interpreter teardown: a broken CUDA context can hang it
