"""Trainer factories that misbehave, for the probe runner's tests (module level: probes import them by name)."""

import os
import signal
import time


def raises_runtime_error(candidate):
    raise RuntimeError("boom: a bug in the user's factory")


def killed_by_host(candidate):
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(candidate):
    time.sleep(600)


def rejects_config(candidate):
    raise ValueError("generation_batch_size (2) must be divisible by num_generations (3).")


def ignores_candidate(candidate):
    from autofit.algos.sft import build_trainer

    return build_trainer(candidate.replace(micro_batch=candidate.micro_batch + 1))


def disk_full(candidate):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device", "/tmp/autofit-cache/model.safetensors")


def returns_none(candidate):
    return None
