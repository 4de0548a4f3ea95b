"""Imported once by the probe forkserver (see ``autofit.runner``): the heavy imports every probe shares.

Not peft and not bitsandbytes: on a CUDA machine importing them initializes CUDA (bitsandbytes asks the device's
compute capability when it loads its native library, and peft imports bitsandbytes), and a process forked after
CUDA was initialized can never use CUDA ("Cannot re-initialize CUDA in forked subprocess"). Probes import them
themselves, after the fork. ``cuda_initialized`` records whether the preload initialized CUDA all the same (a
future library version, a module of the user's): every forked probe checks it and reports a bad fork, and the
runner falls back to the spawn start method.
"""

import importlib
import logging
import os

log = logging.getLogger(__name__)

PRELOADED = ("torch", "transformers", "trl", "datasets", "autofit.worker")


def preload_modules() -> bool:
    """Import ``PRELOADED``; True when that initialized CUDA in this process."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # the probe will report it properly
            log.debug("preload of %s failed: %s", name, exc)
    import torch

    return bool(torch.cuda.is_initialized())


cuda_initialized = preload_modules()
