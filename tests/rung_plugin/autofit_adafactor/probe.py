"""The adafactor rung's probe step: imported by the probe's child process only (torch is loaded there)."""

from __future__ import annotations

from typing import Any, Dict

from autofit.rungs import Candidate, FactoryMisuse, ProbeStep


class AdafactorStep(ProbeStep):
    def after_build(self, trainer: Any, candidate: Candidate, observed: Dict[str, Any]) -> None:
        optim = str(getattr(trainer.args, "optim", ""))
        if optim.rsplit(".", 1)[-1].lower() != "adafactor":
            raise FactoryMisuse(f"the adafactor rung asked for optim=adafactor, and the trainer's config has {optim}")

    def read_back(self, trainer: Any, candidate: Candidate, meter: Any, handle: Any,
                  observed: Dict[str, Any]) -> Dict[str, Any]:
        """What the optimizer holds after the probe's steps: its class and its states' bytes."""
        import torch

        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
        held = sum(value.numel() * value.element_size() for state in optimizer.state.values()
                   for value in state.values() if isinstance(value, torch.Tensor))
        return {"optimizer_class": type(optimizer).__name__, "optimizer_state_bytes": held}
