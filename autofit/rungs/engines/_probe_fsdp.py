"""FSDP2 across the ranks of the simulated (CPU) device (runs in the probe process).

accelerate turns a distributed run into FSDP only on an accelerator: ``AcceleratorState`` applies the FSDP plugin
(built from ``ACCELERATE_USE_FSDP`` and the ``FSDP_*`` variables of the launch environment) inside its branch for
the multi-GPU types, so several CPU processes stay plain data parallel (``MULTI_CPU``). torch's FSDP2 itself runs on
the CPU: ``fully_shard`` and its collectives (all-gather, reduce-scatter) work under gloo. While ``instrumented`` is
open, two stand-ins let the probe train under accelerate's own FSDP2 preparation, the simulated device standing for
each rank's GPU:

- a ``MULTI_CPU`` state that was given the plugin takes it, as the multi-GPU branch would;
- FSDP2 frees each layer's gathered weights by resizing their storage to nothing and allocates them again by
  resizing it back, out of the meter's sight: each resize is told to the meter (``SimulatedMeter.resized``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Iterator
from unittest import mock

log = logging.getLogger(__name__)

STORAGE_HELPERS = ("alloc_storage", "free_storage")


def _taking_the_plugin(original):
    from accelerate.state import DistributedType, PartialState

    @functools.wraps(original)
    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            self.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            log.info("simulated device: FSDP%s across %d CPU processes (gloo)", fsdp_plugin.fsdp_version,
                     self.num_processes)

    return init


def _metered(helper, meter):
    @functools.wraps(helper)
    def resize(tensor):
        helper(tensor)
        meter.resized(tensor)

    return resize


@contextlib.contextmanager
def instrumented(meter) -> Iterator[None]:
    """While open, accelerate sets up FSDP across several CPU processes as it does across GPUs, and ``meter`` sees
    FSDP2's gathered weights come and go."""
    from accelerate.state import AcceleratorState
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(AcceleratorState, "__init__",
                                              _taking_the_plugin(AcceleratorState.__init__)))
        missing = [name for name in STORAGE_HELPERS if not hasattr(_fsdp_param, name)]
        if missing:  # a torch that resizes elsewhere: the meter would count every gathered layer as kept
            raise RuntimeError(f"torch's FSDP2 has no {', '.join(missing)} to meter on the simulated device")
        for module in (_fsdp_param, _fsdp_param_group):
            for name in STORAGE_HELPERS:
                if hasattr(module, name):
                    stack.enter_context(mock.patch.object(module, name, _metered(getattr(_fsdp_param, name), meter)))
        yield
