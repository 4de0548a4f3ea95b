"""TRL's activation offloading as a rung: the rung (search side) and its probe step (``_probe``, the child's: TRL's
offloading made to run on the simulated device, its host copies counted)."""

from autofit.rungs.activation_offload._rung import ActivationOffload

__all__ = ["ActivationOffload"]
