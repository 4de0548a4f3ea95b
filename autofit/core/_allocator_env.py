"""PyTorch's caching allocator options as the process sees them: ``PYTORCH_ALLOC_CONF``, or, where it is unset, the
older ``PYTORCH_CUDA_ALLOC_CONF`` that most launch files still carry (torch reads both; the newer wins, they are not
merged)."""

from __future__ import annotations

from typing import Mapping

ALLOC_ENV = "PYTORCH_ALLOC_CONF"
LEGACY_ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def allocator_options(env: Mapping[str, str]) -> str:
    """The allocator options in effect for ``env`` ("" where none are set)."""
    return str(env.get(ALLOC_ENV, env.get(LEGACY_ALLOC_ENV, "")))
