"""This machine's rates for the throughput model on the CPU meter (``RATE_NAMES``: the matmul FLOP rate, the copy
bandwidth, one operator's time, ...), measured by ``autofit.probe._rates`` in a process of its own (the search never
imports torch): 4-6 s on two cores, at most ``MEASURE_TIMEOUT_S``, once per search process, and only where the
throughput model has a timed probe to calibrate on (``autofit.search._speed_skip``).

The measurement is kept in the cache folder for ``MAX_AGE_S``, for the same machine, Python and thread settings:
searches started within that time (a user's next try, the command-line searches of a test suite) share it. What the
rates decide is the relative cost of configurations; the absolute speed is calibrated on each search's own timed
probes, so a measurement ten minutes old decides what a fresh one would on a machine whose load did not change
more than its band."""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from typing import Dict, Optional, Tuple

from autofit.core import InputError, one_line
from autofit.machine import RATE_NAMES, atomic_write_text, cache_subfolder, read_own_file

log = logging.getLogger(__name__)

MAX_AGE_S = 600.0
# Bounded to seconds (4-6 s on an idle two-core machine, torch's import included): one that takes longer runs on a
# machine too busy for its rates to mean much, and the ties of speed stay with the timing.
MEASURE_TIMEOUT_S = 30
_RATES: Dict[str, Optional[Tuple[float, ...]]] = {}  # this process's: measured or read once


def machine_rates() -> Optional[Tuple[float, ...]]:
    """The rates in ``RATE_NAMES`` order; None where they cannot be measured (a tie then stays with the timing)."""
    if "cpu" not in _RATES:
        _RATES["cpu"] = _kept() or _measured()
    return _RATES["cpu"]


def _machine() -> Dict[str, object]:
    """What the rates were measured on: a measurement of another is not this one's."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"host": platform.node(), "python": sys.executable, "cpus": cpus,
            "threads": {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}


def _kept() -> Optional[Tuple[float, ...]]:
    try:
        entry = json.loads(read_own_file(cache_subfolder("rates") / "rates.json", limit=1 << 16))
        age = time.time() - float(entry["measured_at"])
        if entry["machine"] != _machine() or not 0 <= age <= MAX_AGE_S:
            return None
        rates = tuple(float(entry["rates"][name]) for name in RATE_NAMES)
    except (InputError, OSError, ValueError, KeyError, TypeError):  # none kept, or not as autofit wrote it
        return None
    log.debug("this machine's rates, measured %.0f s ago, read from the cache", age)
    return rates


def _measured() -> Optional[Tuple[float, ...]]:
    try:
        done = subprocess.run([sys.executable, "-m", "autofit.probe._rates"], capture_output=True, text=True,
                              timeout=MEASURE_TIMEOUT_S, check=True)
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        rates = tuple(float(measured[name]) for name in RATE_NAMES)
    except subprocess.TimeoutExpired:
        log.info("this machine's rates were not measured within %d s: ties of speed stay with the timing",
                 MEASURE_TIMEOUT_S)
        return None
    except subprocess.CalledProcessError as exc:  # its own command line is no business of the user's
        last = exc.stderr.strip().splitlines()[-1:] if exc.stderr else []
        log.info("this machine's rates could not be measured (exit %s%s): ties of speed stay with the timing",
                 exc.returncode, f": {one_line(last[0])}" if last else "")
        return None
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError) as exc:
        log.info("this machine's rates could not be measured (%s: %s): ties of speed stay with the timing",
                 type(exc).__name__, one_line(exc))
        return None
    entry = {"measured_at": time.time(), "machine": _machine(), "rates": dict(zip(RATE_NAMES, rates, strict=True))}
    try:
        atomic_write_text(cache_subfolder("rates") / "rates.json", json.dumps(entry))
    except (InputError, OSError) as exc:  # no cache to keep it in: the next search measures again
        log.debug("this machine's rates not kept: %s", exc)
    return rates
