"""What a candidate does with the activations its backward pass needs: the one place the memory and speed models read
``Candidate.checkpointing``, ``.activation_offload`` and ``.liger``.

The three are one helper because their effects are intertwined, not three independent terms. Checkpointing keeps
only each decoder layer's input and reruns the layer's forward inside the backward (a third pass: its bytes, FLOPs,
operators and ZeRO-3 hooks); activation offloading moves what is saved to host memory (every layer's saved tensors,
or with checkpointing only their inputs) and its copies' time overlaps the forward and that backward, recompute
included; Liger's kernels change what a layer saves (``_activations.liger_saving_per_token_layer``), which is what
offloading copies and, without checkpointing, what the device keeps. Eager attention's scores stay one layer's on
the device under either of the first two. Each module of the memory model asks this policy, so a rung that changes
how activations are kept changes one reading, not six.
"""

from __future__ import annotations

from typing import NamedTuple

from autofit.core import Candidate


class ActivationPolicy(NamedTuple):
    """How a step keeps its saved activations (read from one candidate)."""

    recomputes: bool  # gradient checkpointing: layer inputs kept, each decoder layer's forward rerun in the backward
    offloads_activations: bool  # TRL's activation offloading: saved tensors wait in host memory for the backward
    liger_kernels: bool  # Liger's RMSNorm and SwiGLU kernels: fewer tensors saved per layer

    @property
    def passes(self) -> int:
        """Passes over the decoder layers a micro-batch runs: forward and backward, and checkpointing's recompute."""
        return 3 if self.recomputes else 2

    @property
    def one_layer_on_device(self) -> bool:
        """Whether only one layer's eager attention scores stay on the device (recomputed or offloaded), not all."""
        return self.recomputes or self.offloads_activations


def activation_policy(candidate: Candidate) -> ActivationPolicy:
    """The candidate's checkpointing, activation offloading and Liger kernels, read once."""
    return ActivationPolicy(recomputes=candidate.checkpointing, offloads_activations=candidate.activation_offload,
                            liger_kernels=candidate.liger)
