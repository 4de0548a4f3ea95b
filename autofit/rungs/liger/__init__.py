"""Liger's kernels as a rung: the rung (search side) and its probe step (``_probe``, the child's: which modules the
kernels patched, and their failures as the rung's)."""

from autofit.rungs.liger._rung import KERNEL_FAILURE, LIGER_RUNG, LigerKernels

__all__ = ["KERNEL_FAILURE", "LIGER_RUNG", "LigerKernels"]
