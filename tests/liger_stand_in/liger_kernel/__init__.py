"""A stand-in for the liger-kernel package, for tests on the CPU: Liger's Triton kernels need a GPU.

It keeps Liger's contract where memory is concerned, in plain torch autograd functions: the fused RMSNorm saves its
input, its weight and one float32 reciprocal RMS per row; the fused SwiGLU saves the gate and up projections and
recomputes SiLU in the backward pass. transformers finds it by its distribution metadata (the dist-info folder beside
it; transformers 5 also reads ``__version__``) and calls ``liger_kernel.transformers._apply_liger_kernel_to_instance``
as it would Liger's own.
"""

__version__ = "0.6.4"
