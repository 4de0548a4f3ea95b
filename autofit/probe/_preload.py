"""Imported once by the probe forkserver (see ``autofit.probe._runner``): the heavy imports every probe shares.

Not peft and not bitsandbytes: on a CUDA machine importing them initializes CUDA (bitsandbytes asks the device's
compute capability when it loads its native library, and peft imports bitsandbytes), and a process forked after
CUDA was initialized can never use CUDA ("Cannot re-initialize CUDA in forked subprocess"). Probes import them
themselves, after the fork. ``cuda_initialized`` records whether the preload initialized CUDA all the same (a
future library version, a module of the user's): every forked probe checks it and reports a bad fork, and the
runner falls back to the spawn start method.

A build of torch without CUDA (the CPU wheel, as in CI) cannot initialize it, so there peft and bitsandbytes are
preloaded too: each probe is spared their imports (about 1.5 s of a tiny model's 4-5 s probe).
"""

import importlib
import logging
import os
import signal

log = logging.getLogger(__name__)

PRELOADED = ("torch", "transformers", "trl", "datasets", "autofit.probe._worker")
WITHOUT_CUDA_BUILD = ("peft", "bitsandbytes")  # preloaded only where torch is built without CUDA
QUIETED = ("bitsandbytes", "kernels")  # their import-time warnings, kept from the terminal (below)


def preload_modules() -> bool:
    """Import ``PRELOADED``; True when that initialized CUDA in this process."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    cpu_build = torch.version.cuda is None and getattr(torch.version, "hip", None) is None
    # bitsandbytes warns on import that an optional CPU kernel package is missing or that it could not fetch its CPU
    # kernel from the hub, and the hub's ``kernels`` package (a dependency of transformers since 5.25) that it cannot
    # check the kernel's publisher offline; the server has no log of its own, so the warnings would reach the user's
    # terminal at every search (they say nothing about memory)
    quiet = [logging.getLogger(name) for name in QUIETED]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        for name in PRELOADED + (WITHOUT_CUDA_BUILD if cpu_build else ()):
            try:
                importlib.import_module(name)
            except ImportError as exc:  # the probe will report it properly
                log.debug("preload of %s failed: %s", name, exc)
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)
    return bool(torch.cuda.is_initialized())


# Ctrl-C reaches every process of the terminal's group, this server too; multiprocessing's forkserver ignores SIGINT
# only once its preload is done, and a Ctrl-C during these seconds of imports printed a 30-line KeyboardInterrupt
# traceback under the search's (or the worker's) one line. Started from the main thread, the server inherits SIGINT
# ignored (``_runner._server_deaf_to_ctrl_c``); from a slot's thread it is ignored from here on. The search and the
# worker handle Ctrl-C; this server ends when they close its pipe.
signal.signal(signal.SIGINT, signal.SIG_IGN)
cuda_initialized = preload_modules()
