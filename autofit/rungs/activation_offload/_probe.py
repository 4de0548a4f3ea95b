"""TRL's activation offloading, instrumented: the rung's probe step (runs in the probe's child process).

On every device the host copies TRL makes are counted as they come and go (``HostCount``): their peak is the host
memory the configuration needs (pinned on a GPU machine).


TRL's ``OffloadActivations`` copies every saved activation that lives on the accelerator (``torch.accelerator``) to
host memory during the forward pass and brings it back in the backward pass. On the CPU there is no accelerator:
it fails at construction. On the simulated device the CPU stands for the accelerator, so this module lets TRL's own
code run there, unchanged in what it offloads (its size threshold, the LM head left out, parameters skipped, the
forward stash), with three stand-ins for what a CPU cannot show:

- the accelerator is the CPU, and its streams are no-ops (a CPU runs one stream; the copies are synchronous);
- memory is not pinned (pinning needs an accelerator);
- the host copies are host memory for the meter (``SimulatedMeter.mark_host``), and what the backward pass
  brings back is a copy on the device (on a GPU ``.to("cuda")`` allocates it; on the CPU ``.to("cpu")`` would hand
  back the host copy itself). A brought-back copy lives while autograd uses it; on a GPU TRL keeps it one autograd
  node longer.

On CUDA only the counting runs: the probe uses TRL's offloading as it is.

TRL skips offloading a saved tensor whose storage address it offloaded earlier in the pass (its deduplication of
views), or whose address was a parameter's when the trainer was made. Both are addresses, and an address can be
freed and handed to a new tensor (a view's base freed once TRL copied the view; a parameter the model no longer
holds), which then stays on the device (``HostCount.kept``; TRL PR #6241 fixed one way this happened, 1.16 still has
these). How often depends on the allocator, so the probe counts those bytes rather than the ledger guessing them.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from typing import Any, Callable, ContextManager, Dict, Iterator, Optional, Set
from unittest import mock

from autofit.core import TRL_KEYS, Candidate, FactoryMisuse
from autofit.rungs._contract import ProbeStep

TRAINER_MODULES = ("trl.trainer.sft_trainer", "trl.trainer.reward_trainer")
CONTEXT_FACTORY = "get_act_offloading_ctx_manager"


class _Event:
    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _Stream:
    """A stream of a device that runs everything in order, at once."""

    def record_event(self, event=None) -> _Event:
        return event or _Event()

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass


_CURRENT = _Stream()
HOST_STREAMS = types.SimpleNamespace(
    Stream=_Stream, current_stream=lambda *args, **kwargs: _CURRENT,
    stream=lambda stream=None: contextlib.nullcontext(), empty_cache=lambda: None,
)


class _Bytes:
    """Bytes live now, and the most at once."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def add(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak = max(self.peak, self.live)


class HostCount(_Bytes):
    """Bytes of host copies live now, and the most at once; ``kept``: bytes TRL meant to offload but kept on the
    device because their address was one it had offloaded from before (see the module's doc); ``meant``: the two
    together, what TRL set out to offload."""

    def __init__(self) -> None:
        super().__init__()
        self.kept = _Bytes()
        self.meant = _Bytes()
        self.kept_ids: Dict[int, int] = {}  # TRL's tensor id -> bytes kept on the device

    def add(self, nbytes: int) -> None:
        super().add(nbytes)
        self.meant.add(nbytes)

    def keep(self, tensor_id, nbytes: int) -> None:
        self.kept_ids[tensor_id] = nbytes
        self.kept.add(nbytes)
        self.meant.add(nbytes)

    def release(self, tensor_id) -> None:
        nbytes = self.kept_ids.pop(tensor_id, 0)
        self.kept.add(-nbytes)
        self.meant.add(-nbytes)


class _CountingTracker(dict):
    """TRL's tensor tracker. An entry whose second field is True holds a host copy (``pack_tensor``); the entry is
    deleted when the backward pass takes the tensor back, and the tracker cleared at each step."""

    def __init__(self, count: HostCount, meter=None) -> None:
        super().__init__()
        self._count = count
        self._meter = meter

    @staticmethod
    def _host_bytes(value) -> int:
        if isinstance(value, tuple) and len(value) >= 2 and value[1] is True:
            return value[0].untyped_storage().nbytes()
        return 0

    def __setitem__(self, key, value) -> None:
        nbytes = self._host_bytes(value)
        if nbytes:
            self._count.add(nbytes - self._host_bytes(self.get(key)))
            if self._meter is not None:
                self._meter.mark_host(value[0])
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        self._count.add(-self._host_bytes(self.get(key)))
        self._count.release(key)
        super().__delitem__(key)

    def clear(self) -> None:
        self._count.add(-sum(self._host_bytes(value) for value in self.values()))
        for key in self:
            self._count.release(key)
        super().clear()


def _storage_key_function() -> Optional[Callable[[Any], Any]]:
    from trl.models import activation_offloading

    return getattr(activation_offloading, "_get_unique_tensor_key", None)


def _would_offload(context, activation) -> bool:
    import torch

    return (activation.device.type == context.accelerator_type and not isinstance(activation, torch.nn.Parameter)
            and activation.element_size() * activation.nelement() >= context.min_tensor_size_bytes)


def _storage_pointer(tensor) -> int:
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, AttributeError):
        return 0


def _counting_kept(context, count: HostCount, model) -> None:
    """Wrap the context's pack hook to count what TRL keeps on the device for an address it tracks from a tensor
    that no longer lives: a storage key whose owner (a view's base) is gone, or a parameter's address taken at the
    trainer's making whose parameter is not the model's now (the address is a new tensor's)."""
    if _storage_key_function() is None or not getattr(context, "use_streams", False) \
            or not hasattr(context, "storage_to_tensor_id"):
        return
    pack, key_of = context.pack_hook, _storage_key_function
    owners: Dict[Any, Any] = {}  # storage key -> weak reference to the tensor owning the storage packed under it
    parameters: Set[int] = set()  # the model's parameters' addresses in this pass

    def pack_counting(activation):
        key = key_of()(activation)  # looked up per call, as TRL's pack does
        if context.is_first_forward_call:  # the pass's first pack forgets the last pass's addresses
            parameters.clear()
            parameters.update(_storage_pointer(p) for p in model.parameters())
            stale = False
        else:
            owner = owners.get(key)
            stale = key in context.storage_to_tensor_id and (owner is None or owner() is None)
        tensor_id = pack(activation)
        owners[key] = weakref.ref(activation if activation._base is None else activation._base)
        if not _would_offload(context, activation):
            return tensor_id
        if not stale:
            kept = context.tracker.get(tensor_id)
            pointer = _storage_pointer(activation)
            stale = kept is not None and kept[1] is False and pointer in getattr(context, "param_storages", ()) \
                and pointer not in parameters
        if stale:
            count.keep(tensor_id, activation.element_size() * activation.nelement())
        return tensor_id

    context.pack_hook = pack_counting


def _counted(original, count: HostCount):
    def build(model, *args, **kwargs):
        context = original(model, *args, **kwargs)
        if hasattr(context, "tracker"):
            context.tracker = _CountingTracker(count)
            _counting_kept(context, count, model)
        return context

    return build


def _on_simulated_device(original, count: HostCount, meter):
    import torch

    def build(model, *args, **kwargs):
        kwargs["use_pin_memory"] = False
        real_module = torch.get_device_module
        with mock.patch.object(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cpu")), \
                mock.patch.object(torch, "get_device_module",
                                  lambda device=None: HOST_STREAMS if str(device) == "cpu" else real_module(device)):
            context = original(model, *args, **kwargs)
        if not hasattr(context, "tracker"):  # offloading off (a no-op manager): nothing to stand in for
            return context
        context.tracker = _CountingTracker(count, meter)
        _counting_kept(context, count, model)
        context.unpack_hook = _brought_back_to_device(context.unpack_hook, meter)
        return context

    return build


def _brought_back_to_device(unpack, meter):
    def unpack_on_device(tensor_id):
        tensor = unpack(tensor_id)
        if meter.is_host(tensor):
            return tensor.clone()
        return tensor

    return unpack_on_device


@contextlib.contextmanager
def instrumented(meter, simulated: bool) -> Iterator[HostCount]:
    """While open, the offloading contexts TRL's SFT and reward trainers build count their host copies; with
    ``simulated``, they also run on the simulated device, their copies host memory for ``meter``."""
    import importlib

    count = HostCount()
    with contextlib.ExitStack() as stack:
        for name in TRAINER_MODULES:
            module = importlib.import_module(name)
            original = getattr(module, CONTEXT_FACTORY)
            wrapped = _on_simulated_device(original, count, meter) if simulated else _counted(original, count)
            stack.enter_context(mock.patch.object(module, CONTEXT_FACTORY, wrapped))
        yield count


def offloaded_activations(trainer, host_copies, meter) -> Dict[str, int]:
    """The most host memory the offloaded activations took at once, the most TRL kept on the device instead (see the
    module's doc), and the most of the two together; on the simulated meter they leave the device's peaks, and its
    budget is checked now. A trainer that did not offload measured something else: an error."""
    if not getattr(trainer.args, TRL_KEYS.activation_offloading, False):
        raise FactoryMisuse(
            "the candidate offloads activations but the trainer's config has activation_offloading off: build the "
            "trainer's config from candidate.training_args() inside the factory"
        )
    if hasattr(meter, "check_budget"):
        meter.check_budget()
    return {"activation_host_bytes": host_copies.peak, "activation_kept_bytes": host_copies.kept.peak,
            "activation_meant_bytes": host_copies.meant.peak}


class ActivationOffloadStep(ProbeStep):
    """TRL's activation offloading: its host copies counted around training (on the simulated device, TRL's code made
    to run there), their peak read back."""

    def active(self, candidate: Candidate) -> bool:
        return candidate.activation_offload

    def keeps_host(self, candidate: Candidate) -> bool:
        return True  # its host copies

    def around(self, candidate: Candidate, meter: Any) -> ContextManager[Any]:
        return instrumented(meter, candidate.device == "cpu")

    def read_back(self, trainer: Any, candidate: Candidate, meter: Any, handle: Any,
                  observed: Dict[str, Any]) -> Dict[str, Any]:
        return offloaded_activations(trainer, handle, meter)
