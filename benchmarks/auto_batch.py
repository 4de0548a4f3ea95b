"""Method (b): transformers' ``auto_find_batch_size=True``, really run on the same trainer.

One fresh process (forked from the same forkserver as autofit's probes, so neither side pays the imports) builds the
trainer with autofit's own factory (micro-batch = the effective batch, no accumulation, ``auto_find_batch_size``
passed as a user argument) and trains under autofit's ``SimulatedMeter``. transformers wraps its inner training loop
in accelerate's ``find_executable_batch_size``: on an out-of-memory error it lowers the per-device batch (accelerate
1.x multiplies it by 0.9, rounded down) and runs the loop again, leaving ``gradient_accumulation_steps`` as it was,
so the effective batch shrinks with it.

Each attempt of the inner loop gets its own meter phase, so the peak of the attempt that finished is reported
separately from the failed ones (whose peak is, by construction, above the budget).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict

PRELOAD = ["autofit.probe._preload"]  # the same preload as autofit's ProcessRunner


def run_in_fresh_process(job: Dict[str, Any], workdir: Path, timeout_s: float = 600.0) -> Dict[str, Any]:
    """Run ``job`` (see ``_run``) in a process forked from the forkserver; returns its result dict."""
    workdir.mkdir(parents=True, exist_ok=True)
    result_path = workdir / "result.json"
    result_path.unlink(missing_ok=True)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    started = time.perf_counter()
    process = context.Process(target=child_main, args=(job, str(result_path), str(workdir / "run.log")),
                              name="bench-auto-find-batch-size")
    process.start()
    process.join(timeout_s)
    if process.is_alive():
        process.kill()
        process.join()
        result = {"status": "timeout", "error": f"killed after {timeout_s:.0f} s"}
    elif result_path.exists():
        result = json.loads(result_path.read_text())
    else:
        result = {"status": "crash", "error": f"exit code {process.exitcode} without a result"}
    result["wall_s"] = time.perf_counter() - started
    result["log"] = str(workdir / "run.log")
    return result


def child_main(job: Dict[str, Any], result_path: str, log_path: str) -> None:
    from autofit.probe._child import detach_into_log

    detach_into_log(log_path)
    try:
        result = _run(job)
    except BaseException as exc:  # noqa: BLE001 - report anything
        import traceback

        traceback.print_exc()
        result = {"status": "crash", "error": f"{type(exc).__name__}: {exc}"[:500]}
    tmp = result_path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle)
    os.replace(tmp, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    from multiprocessing import util

    util._run_finalizers()
    os._exit(0)


def _message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:400]


def _run(job: Dict[str, Any]) -> Dict[str, Any]:
    import importlib

    import torch
    from transformers import TrainerCallback

    from autofit import probe_kit
    from autofit.core import Candidate, ProbeSettings
    from autofit.probe import _virtual_checkpoint as virtual_checkpoint
    from autofit.probe._meters import SimulatedMeter

    module, _, name = job["factory"].partition(":")
    factory = getattr(importlib.import_module(module), name)
    effective = job["effective_batch"]
    candidate = Candidate(
        algo=job["algo"],
        model=job["model"],
        device="cpu",
        micro_batch=effective,
        grad_accum=1,
        max_length=job["max_length"],
        user_args=(("auto_find_batch_size", True),),
        num_generations=job.get("num_generations"),
        prompt_length=job.get("prompt_length"),
        probe=ProbeSettings(steps=job["steps"], output_dir=job["output_dir"]),
    )
    probe_kit.model_path(candidate)  # the weightless checkpoint is written outside the meter, as in probes
    meter = SimulatedMeter(job["budget_bytes"])
    attempts = []
    with meter:
        meter.set_phase("load")
        try:
            with virtual_checkpoint.fill_on_load():  # the model gets values as in autofit's probes
                trainer = factory(candidate)
        except Exception as exc:  # noqa: BLE001 - TRL validates its config in the constructor (GRPO refuses it)
            refused = "auto_find_batch_size" in str(exc)
            return {"status": "refused" if refused else "failed", "error": _message(exc), "attempts": []}
        meter.track(*[v for v in vars(trainer).values() if isinstance(v, torch.nn.Module)])
        original = trainer._inner_training_loop

        def inner(batch_size=None, *args, **kwargs):
            attempts.append({"batch": batch_size, "outcome": "running", "step_times": []})
            meter.set_phase(f"attempt-{len(attempts)}")
            try:
                out = original(batch_size, *args, **kwargs)
            except BaseException as exc:
                attempts[-1]["outcome"] = "OOM" if isinstance(exc, torch.OutOfMemoryError) else type(exc).__name__
                attempts[-1]["error"] = _message(exc)
                raise
            attempts[-1]["outcome"] = "OK"
            return out

        trainer._inner_training_loop = inner  # train() looks it up on the instance and wraps it in the finder

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                self.mark = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                attempts[-1]["step_times"].append(time.perf_counter() - self.mark)

        trainer.add_callback(StepTimer())
        error = None
        try:
            trainer.train()
        except BaseException as exc:  # noqa: BLE001 - e.g. "No executable batch size found, reached zero."
            error = _message(exc)
    peaks = meter.peaks()
    for index, attempt in enumerate(attempts, start=1):
        attempt["peak_bytes"] = peaks.get(f"attempt-{index}", 0)
    last = attempts[-1] if attempts else None
    finished = error is None and last is not None and last["outcome"] == "OK"
    batch = int(trainer._train_batch_size)
    accumulation = int(trainer.args.gradient_accumulation_steps)
    timed = (last["step_times"][1:] or last["step_times"]) if last else []
    tokens_per_step = batch * accumulation * (job["max_length"] + (job.get("prompt_length") or 0))
    return {
        "status": "finished" if finished else "failed",
        "error": error or "",
        "batch": batch,
        "grad_accum": accumulation,
        "effective_batch": batch * accumulation,
        "steps": int(trainer.state.global_step) if finished else (len(last["step_times"]) if last else 0),
        "peak_bytes": last["peak_bytes"] if last else 0,
        "overall_peak_bytes": max(peaks.values(), default=0),
        "tokens_per_second": tokens_per_step * len(timed) / sum(timed) if finished and timed and sum(timed) else 0.0,
        "attempts": attempts,
    }
