"""Liger's kernels in a probe (the rung's probe step, in the probe's child process): which modules of the trainer's
model they patched, read back after training (transformers' Trainer applies them when ``train()`` starts, where
``use_liger_kernel`` is set).

Liger binds its fused forwards to the module instances (``module.forward`` comes from ``liger_kernel``), so the
count needs no knowledge of its internals. A trainer whose config has the flag off measured something else (the
user's factory's mistake, named); a model Liger patched nothing of is the rung's failure, not the search's.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from autofit.core import INFRASTRUCTURE, TRL_KEYS, USER, Candidate, FactoryMisuse, Outcome
from autofit.rungs._contract import ProbeStep
from autofit.rungs.liger._rung import KERNEL_FAILURE

LIGER_PACKAGE = "liger_kernel"


class KernelsNotApplied(RuntimeError):
    """Liger was asked for and patched no module of this model (a family it does not know)."""


def liger_modules(model) -> int:
    """Modules whose forward (bound to the instance) or class comes from Liger."""
    count = 0
    for module in model.modules():
        forward = module.__dict__.get("forward")
        origin = getattr(getattr(forward, "__func__", forward), "__module__", None) or type(module).__module__
        if origin.split(".")[0] == LIGER_PACKAGE:
            count += 1
    return count


def check_liger_flag(trainer) -> None:
    """Before training: the trainer's config must ask for the kernels, or the probe would not measure them."""
    if not getattr(trainer.args, TRL_KEYS.use_liger, False):
        raise FactoryMisuse(
            "the candidate uses Liger's kernels but the trainer's config has use_liger_kernel off: build the "
            "trainer's config from candidate.training_args() inside the factory"
        )


def liger_patched(trainer) -> int:
    """After training (transformers applies the kernels when ``train()`` starts): the modules Liger patched."""
    patched = liger_modules(trainer.model)
    if not patched:
        model_type = getattr(getattr(trainer.model, "config", None), "model_type", "?")
        raise KernelsNotApplied(f"Liger patched no module of this model (model_type {model_type})")
    return patched


class LigerStep(ProbeStep):
    """Liger's kernels: the trainer's config must ask for them; after training, the modules they patched. A probe
    they break (or a transformers that refuses the package) is the rung's: the search goes on without them."""

    def active(self, candidate: Candidate) -> bool:
        return candidate.liger

    def after_build(self, trainer: Any, candidate: Candidate, observed: Dict[str, Any]) -> None:
        check_liger_flag(trainer)

    def read_back(self, trainer: Any, candidate: Candidate, meter: Any, handle: Any,
                  observed: Dict[str, Any]) -> Dict[str, Any]:
        observed["liger_modules"] = liger_patched(trainer)
        return {}

    def failure(self, candidate: Candidate, outcome: Outcome, fault: str, cause: str) -> Optional[Tuple[Outcome, str]]:
        # an ImportError of the package, INVALID otherwise, would read as the trainer rejecting the configuration
        if outcome in (Outcome.CRASH, Outcome.INVALID) and fault not in (USER, INFRASTRUCTURE):
            return Outcome.INVALID, KERNEL_FAILURE
        return None
