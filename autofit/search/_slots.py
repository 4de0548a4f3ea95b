"""Probes side by side on several devices (issue 49, item 1): a slot table of the devices given to probes
(``--gpus-for-probes``), and a runner over it that starts the probes the walk may ask for next on free slots while
the walk's own probe runs.

The walk does not change: it asks for one probe at a time and decides on each answer as it does serially. A probe
started ahead is a measurement kept aside until the walk asks for the same candidate with the same plan (then the
walk takes it instead of starting the probe, waiting for it where it still runs) or dropped unused; it never enters
the study before the walk asks for it. So the answer is the serial search's on the same measurements, and what
changes is how long the walk waits (``rounds``: the critical path in probes, where probes take the same time).

A candidate of k processes (``--gpus k``) takes k free slots and sees only them (``CUDA_VISIBLE_DEVICES``); its
ranks meet on a port of their own (``ProcessRunner``). A probe that ran while others ran says how many
(``stats["beside"]``): the speed judge never ranks its timing against one measured alone by the timings
(``autofit.search._speed_tie``), and verifications run alone (``drain``)."""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from autofit.core import Candidate, InputError, ProbeResult, SearchSpec
from autofit.probe import Runner

log = logging.getLogger(__name__)

BESIDE = "beside"  # ProbeResult.stats key: how many other probes ran for some of the time this one ran

Plan = Tuple[str, int, int, Optional[float], bool]  # (candidate key, steps, min_steps, time cap, full accumulation)


class SlotTable:
    """Which devices are free, and how much of the host's memory: a probe takes as many devices as it has processes
    and the host memory its offloading needs, and gives them back when it ends. A probe that alone needs more host
    memory than there is waits until it runs alone (the host-memory check before the search is its own)."""

    def __init__(self, devices: Sequence[str], host_bytes: Optional[float] = None):
        if len(set(devices)) != len(devices) or not devices:
            raise ValueError(f"slots need distinct devices, got {list(devices)}")
        self.devices = list(devices)
        self.host_bytes = host_bytes  # None: not counted
        self._free = list(devices)
        self._host_used = 0.0
        self._changed = threading.Condition()

    def _room(self, count: int, host: float) -> bool:
        if len(self._free) < count:
            return False
        alone = len(self._free) == len(self.devices)
        return self.host_bytes is None or not host or alone or self._host_used + host <= self.host_bytes

    def take(self, count: int, wait: bool = True, host: float = 0.0) -> Optional[List[str]]:
        """``count`` free devices and ``host`` bytes of host memory, waiting for them unless ``wait`` is False (then
        None where there is not room)."""
        if count > len(self.devices):
            raise ValueError(f"a probe of {count} processes needs {count} devices; {len(self.devices)} are given "
                             f"to probes")
        with self._changed:
            while not self._room(count, host):
                if not wait:
                    return None
                self._changed.wait()
            taken, self._free = self._free[:count], self._free[count:]
            self._host_used += host
            return taken

    def give(self, devices: Sequence[str], host: float = 0.0) -> None:
        with self._changed:
            self._free.extend(devices)
            self._free.sort(key=self.devices.index)
            self._host_used -= host
            self._changed.notify_all()

    @property
    def free(self) -> int:
        with self._changed:
            return len(self._free)


class SlotRunner:
    """A ``Runner`` over a slot table: ``run`` is the walk's probe (taken from the probes started ahead where one
    matches); ``ahead`` starts the walk's next probe and, on the slots left free, the ones it may ask for after."""

    def __init__(self, runner: Runner, devices: Sequence[str],
                 on_devices: Optional[Callable[[Sequence[str]], Runner]] = None, *,
                 host_bytes: Optional[float] = None, host_need: Optional[Callable[[Candidate], float]] = None,
                 per_rank: bool = True):
        self.runner = runner
        self.per_rank = per_rank  # a candidate takes a slot per process; False: one slot (a worker) runs them all
        self.slots = SlotTable([str(device) for device in devices], host_bytes)
        self.host_need = host_need or (lambda _: 0.0)  # host bytes a candidate's offloading takes
        self.threads = max(1, (os.cpu_count() or 1) // len(self.slots.devices))  # the host's cores, shared
        if on_devices is None and hasattr(runner, "on_devices"):
            on_devices = partial(runner.on_devices, threads=self.threads)
        self._on_devices = on_devices or (lambda _: runner)
        self._pool = ThreadPoolExecutor(max_workers=len(self.slots.devices), thread_name_prefix="autofit-slot")
        self._lock = threading.Lock()
        self._pending: Dict[Plan, Future[ProbeResult]] = {}
        self._running: Dict[int, int] = {}  # a running probe's id: how many other probes ran beside it so far
        self._next_id = 0
        # The critical path in probes: the probes started together (the walk's and those ahead of it) are one round,
        # and a probe the walk takes that was started in a round it has passed costs no other
        self.rounds = 0
        self.critical_s = 0.0  # the probes' own seconds along that path (``ProbeResult.seconds``)
        self._rounds: Dict[Plan, int] = {}  # a probe started ahead: its round
        self.started = 0  # probes started, ahead or not
        self.unused = 0  # probes started ahead that the walk did not ask for

    @staticmethod
    def plan(candidate: Candidate, steps: int, min_steps: int = 0, time_cap_s: Optional[float] = None,
             full_accumulation: bool = False) -> Plan:
        return candidate.key(), steps, min_steps, time_cap_s, full_accumulation

    # -- the walk's side ----------------------------------------------------------------------------------------
    def run(self, candidate: Candidate, steps: int, *, min_steps: int = 0, time_cap_s: Optional[float] = None,
            full_accumulation: bool = False) -> ProbeResult:
        plan = self.plan(candidate, steps, min_steps, time_cap_s, full_accumulation)
        with self._lock:
            future = self._pending.pop(plan, None)
            group = self._rounds.pop(plan, self.rounds + 1)
        if future is None:
            future = self._start(candidate, plan, wait=True)
            assert future is not None  # a start that waits for its slots always starts
            with self._lock:
                self._pending.pop(plan, None)
                self._rounds.pop(plan, None)
        result = future.result()
        if group > self.rounds:  # the walk waited for this probe's round
            self.rounds, self.critical_s = group, self.critical_s + result.seconds
        return result

    def ahead(self, now: Candidate, then: Sequence[Candidate], steps: int) -> None:
        """Start ``now`` (the probe the walk asks for next), then as many of ``then`` (the ones it may ask for
        after, most likely first) as free slots take, each once."""
        group = self.rounds + 1
        for index, candidate in enumerate([now, *then]):
            plan = self.plan(candidate, steps)
            with self._lock:
                if plan in self._pending:
                    continue
            if self._start(candidate, plan, wait=index == 0) is None:
                return
            with self._lock:
                self._rounds[plan] = group

    def drain(self) -> None:
        """Stop every probe started ahead that the walk did not ask for (a runner with a ``stop`` event kills them;
        another's are waited for) and drop them: what follows runs alone."""
        with self._lock:
            pending, self._pending, self._rounds = list(self._pending.values()), {}, {}
        stop = getattr(self.runner, "stop", None)
        if pending and stop is not None:
            stop.set()
        try:
            for future in pending:
                future.exception()  # waits; a probe's own failure, or its stop, is a measurement no one asked for
        finally:
            if stop is not None:
                stop.clear()
        self.unused += len(pending)

    def close(self) -> None:
        """The search ended (or was interrupted): every probe still running is stopped, the walk's own included."""
        with self._lock:
            self.unused += len(self._pending)
            self._pending, self._rounds = {}, {}
        stop = getattr(self.runner, "stop", None)
        if stop is not None:
            stop.set()
        self._pool.shutdown(wait=True)
        if stop is not None:
            stop.clear()

    # -- the slots' side ----------------------------------------------------------------------------------------
    def _start(self, candidate: Candidate, plan: Plan, wait: bool) -> Optional[Future[ProbeResult]]:
        host = self.host_need(candidate)
        # a server the vllm-server rung placed takes GPUs of its own beside the ranks (the simulated device's is a
        # process on the host)
        served = candidate.vllm_server_gpus if candidate.device == "cuda" else 0
        devices = self.slots.take(candidate.ranks + served if self.per_rank else 1, wait=wait, host=host)
        if devices is None:
            return None
        with self._lock:
            self._next_id += 1
            probe_id = self._next_id
            for other in self._running:
                self._running[other] += 1
            self._running[probe_id] = len(self._running)
            self.started += 1
        future = self._pool.submit(self._probe, probe_id, devices, host, candidate, plan)
        with self._lock:
            self._pending[plan] = future
        log.debug("probe %s on device(s) %s", candidate.describe(), ",".join(devices))
        return future

    def _probe(self, probe_id: int, devices: List[str], host: float, candidate: Candidate, plan: Plan
               ) -> ProbeResult:
        _, steps, min_steps, time_cap_s, full_accumulation = plan
        try:
            result = self._on_devices(devices).run(candidate, steps, min_steps=min_steps, time_cap_s=time_cap_s,
                                                   full_accumulation=full_accumulation)
        finally:
            with self._lock:
                beside = self._running.pop(probe_id)
            self.slots.give(devices, host)
        if beside:
            result = replace(result, stats={**result.stats, BESIDE: beside})
        return result

    def use(self) -> Dict[str, Any]:
        """What best.json says of the probes side by side."""
        return {"devices": list(self.slots.devices), "rounds": self.rounds, "started": self.started,
                "unused": self.unused + len(self.pending()), "workers": not self.per_rank}

    def pending(self) -> List[Plan]:
        with self._lock:
            return list(self._pending)


def slot_runner(spec: SearchSpec, runner: Runner) -> Optional[SlotRunner]:
    """``runner`` over the devices given to probes, sharing the host's memory by what the memory model says each
    candidate offloads; None where probes run one at a time."""
    from autofit import memory_model
    from autofit.search._host_memory import available_host_bytes

    if spec.options.workers is not None:  # each worker gives its probe its own devices and host
        return SlotRunner(runner, [f"worker-{index}" for index in range(spec.options.workers)], per_rank=False)
    devices = probe_slots(spec)
    if devices is None:
        return None
    shape = memory_model.shape_or_none(spec.options.model)

    def host_need(candidate: Candidate) -> float:
        return memory_model.host_bytes(candidate, shape, spec.device) if shape is not None else 0.0

    return SlotRunner(runner, devices, host_bytes=available_host_bytes(), host_need=host_need)


def probe_slots(spec: SearchSpec) -> Optional[List[str]]:
    """The devices given to probes (``--gpus-for-probes``), checked against the processes a candidate runs; None
    where probes run one at a time. Under a ``CUDA_VISIBLE_DEVICES`` (a Slurm allocation sets one) the indices are
    CUDA's in this process, 0 the first visible GPU, and each probe is given the entries they name."""
    devices = spec.options.gpus_for_probes
    if not devices:
        return None
    given = ",".join(map(str, devices))
    if spec.ranks > len(devices):
        raise InputError(f"--gpus-for-probes {given} gives {len(devices)} device(s), and a "
                         f"candidate of --gpus {spec.ranks} runs {spec.ranks} processes, one per device: give at least "
                         f"{spec.ranks}")
    visible = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    if visible and spec.device == "cuda":  # indices as CUDA numbers them here: within this process's visible GPUs
        if max(devices) >= len(visible):
            raise InputError(f"--gpus-for-probes {given} names GPU {max(devices)}, and CUDA_VISIBLE_DEVICES="
                             f"{','.join(visible)} leaves this process {len(visible)}: give indices from 0 to "
                             f"{len(visible) - 1}")
        return [visible[index] for index in devices]
    return [str(device) for device in devices]


def beside(result: ProbeResult) -> int:
    """How many other probes ran for some of the time ``result``'s ran (0: alone)."""
    return int(result.stats.get(BESIDE, 0) or 0)
