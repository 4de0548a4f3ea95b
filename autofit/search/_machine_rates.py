"""This machine's rates for the throughput model, each measured by a child module in a process of its own (the
search never imports torch) and kept in the cache folder for the same machine, Python and thread settings:

- the CPU meter's (``RATE_NAMES``: the matmul FLOP rate, the copy bandwidth, one operator's time, ...), by
  ``autofit.probe._rates``: 4-6 s on two cores, at most ``MEASURE_TIMEOUT_S``, once per search process, and only
  where the throughput model has a timed probe to calibrate on (``autofit.search._speed_skip``); kept ``MAX_AGE_S``.
  What they decide is the relative cost of configurations; the absolute speed is calibrated on each search's own
  timed probes, so a measurement ten minutes old decides what a fresh one would on a machine whose load did not
  change more than its band.
- the host's AdamW (torch's, and DeepSpeed's CPUAdam where built), by ``autofit.probe._host_adam``, on the threads
  one rank gets: the optimizer step of an offloading engine (issue 60, item 3); kept ``HOST_ADAM_MAX_AGE_S``, the
  host's cores changing less than its load.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from autofit.core import InputError, SearchSpec, one_line
from autofit.machine import RATE_NAMES, atomic_write_text, cache_subfolder, card_of_device, first_gpu, read_own_file
from autofit.memory_model import Card, host_of

log = logging.getLogger(__name__)

MAX_AGE_S = 600.0
HOST_ADAM_MAX_AGE_S = 86400.0
# Bounded to seconds (4-6 s on an idle two-core machine, torch's import included): one that takes longer runs on a
# machine too busy for its rates to mean much, and the ties of speed stay with the timing.
MEASURE_TIMEOUT_S = 30
# Bounded as the rates are: the host's AdamW takes 3-5 s on two idle cores (torch's import included; DeepSpeed's too,
# 8-9 s, where its CPUAdam is built)
HOST_ADAM_TIMEOUT_S = 30
_RATES: Dict[str, Optional[Dict[str, Any]]] = {}  # this process's: measured or read once
# A measurement that failed (timed out on a busy machine) is not tried again for ``MAX_AGE_S``: the processes after it
# (each estimate, each search) would each wait out its timeout; the figures fall back as for any failure
FAILED: Dict[str, Any] = {}


def machine_rates() -> Optional[Tuple[float, ...]]:
    """The rates in ``RATE_NAMES`` order; None where they cannot be measured (a tie then stays with the timing)."""
    found = _rates("rates.json", ["autofit.probe._rates"], MEASURE_TIMEOUT_S, MAX_AGE_S,
                   lambda rates: [float(rates[name]) for name in RATE_NAMES])
    return tuple(float(found[name]) for name in RATE_NAMES) if found else None


def host_adam_rates(threads: int) -> Optional[Dict[str, Any]]:
    """This host's AdamW in parameters a second per thread on ``threads`` threads (``autofit.probe._host_adam``:
    "torch", and "deepspeed" or None where its CPUAdam is not built); None where not measured (the throughput model
    then takes its assumed rates)."""
    return _rates(f"host-adam-{threads}.json", ["autofit.probe._host_adam", str(threads)], HOST_ADAM_TIMEOUT_S,
                  HOST_ADAM_MAX_AGE_S, _torch_rate)


def host_card(card: Card, spec: SearchSpec) -> Card:
    """``card`` with the host its ranks share: on a GPU (this machine trains) this machine's cores, its AdamW timed
    on the cores one rank gets; planning for another (a card named elsewhere), ``--host-cores`` or the assumed cores,
    at this machine's rate per core."""
    here = _cores()
    gpu = first_gpu() if spec.device == "cuda" else None
    trains_here = gpu is not None and (card_of_device(gpu.name, gpu.total_bytes) or card).name == card.name
    cores = spec.options.host_cores or (here if trains_here else 0)
    threads = max(1, here // spec.ranks) if trains_here else 1
    return host_of(card, cores, host_adam_rates(threads), threads, trains_here)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _torch_rate(rates: Dict[str, Any]) -> float:
    rate = float(rates["torch"])
    if not rate > 0:
        raise ValueError(f"torch's AdamW at {rate} parameters a second")
    return rate


def _rates(name: str, command: List[str], timeout: float, max_age: float,
           check: Callable[[Dict[str, Any]], object]) -> Optional[Dict[str, Any]]:
    if name not in _RATES:
        kept = _kept(name, max_age, check)
        _RATES[name] = None if kept is FAILED else kept or _measured(name, command, timeout, check)
    return _RATES[name]


def _machine() -> Dict[str, object]:
    """What the rates were measured on: a measurement of another is not this one's."""
    return {"host": platform.node(), "python": sys.executable, "cpus": _cores(),
            "threads": {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}


def _kept(name: str, max_age: float, check: Callable[[Dict[str, Any]], object]) -> Optional[Dict[str, Any]]:
    try:
        entry = json.loads(read_own_file(cache_subfolder("rates") / name, limit=1 << 16))
        age = time.time() - float(entry["measured_at"])
        if entry["machine"] != _machine() or not 0 <= age <= max_age:
            return None
        if entry["rates"] is None:
            return FAILED if age <= MAX_AGE_S else None
        rates = dict(entry["rates"])
        check(rates)
    except (InputError, OSError, ValueError, KeyError, TypeError):  # none kept, or not as autofit wrote it
        return None
    log.debug("this machine's %s, measured %.0f s ago, read from the cache", name, age)
    return rates


def _measured(name: str, command: List[str], timeout: float,
              check: Callable[[Dict[str, Any]], object]) -> Optional[Dict[str, Any]]:
    what = f"this machine's rates ({command[0]})"
    try:
        done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=timeout,
                              check=True)
        rates = dict(json.loads(done.stdout.strip().splitlines()[-1]))
        check(rates)
    except subprocess.TimeoutExpired:
        log.info("%s were not measured within %d s", what, timeout)
        return _kept_failure(name)
    except subprocess.CalledProcessError as exc:  # its own command line is no business of the user's
        last = exc.stderr.strip().splitlines()[-1:] if exc.stderr else []
        log.info("%s could not be measured (exit %s%s)", what, exc.returncode, f": {one_line(last[0])}" if last else "")
        return _kept_failure(name)
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError, TypeError) as exc:
        log.info("%s could not be measured (%s: %s)", what, type(exc).__name__, one_line(exc))
        return _kept_failure(name)
    _keep(name, rates)
    return rates


def _kept_failure(name: str) -> Optional[Dict[str, Any]]:
    _keep(name, None)
    return None


def _keep(name: str, rates: Optional[Dict[str, Any]]) -> None:
    entry = {"measured_at": time.time(), "machine": _machine(), "rates": rates}
    try:
        atomic_write_text(cache_subfolder("rates") / name, json.dumps(entry))
    except (InputError, OSError) as exc:  # no cache to keep it in: the next search measures again
        log.debug("this machine's %s not kept: %s", name, exc)
