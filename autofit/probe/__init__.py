"""Probes: one candidate measured by real training in a fresh process.

The search's side is public here: ``ProcessRunner`` (and the ``Runner`` protocol a fake runner follows), how a
trainer factory crosses to a probe (``prepare_factory``), the progress shown while one runs, and TRL's parser of a
``--config`` file, run in a process forked from the probe server (``read_trl_config``), and the cause of a probe
that waited on a killed build's lock (``STALE_LOCK_CAUSE``: the search stops on it at once). The child process's modules
(the worker, the meters, the instrument, the virtual checkpoints, the engines' read-backs) are private and imported
only in the probe. Two public submodules serve user factories: ``autofit.probe.kit`` (a loadable model of
a configuration, a synthesized tokenizer, worst-case rows) and ``autofit.probe.algos`` (the built-in factories).
"""

from autofit.probe._build_locks import STALE_LOCK_CAUSE
from autofit.probe._factory import FactoryError, FactoryPayload, identity, prepare_factory
from autofit.probe._progress import LineProgress, LiveProgress, PlainProgress, ProbeProgress, make_progress
from autofit.probe._runner import ProbeCancelled, ProcessRunner, Runner
from autofit.probe._trl_read import WORLD_SIZE_ENV, read_trl_config

__all__ = ["STALE_LOCK_CAUSE", "FactoryError", "FactoryPayload", "LineProgress", "LiveProgress", "PlainProgress",
           "ProbeCancelled", "ProbeProgress", "ProcessRunner", "Runner", "identity", "make_progress", "prepare_factory",
           "WORLD_SIZE_ENV", "read_trl_config"]
