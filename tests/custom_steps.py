"""Probe steps of rungs that are not autofit's (tests/probe/test_probe_steps.py): the probe's child imports them by
path."""

import os

from autofit.core import Outcome
from autofit.rungs import ProbeStep

CLAIMED = "custom-rung"


class RecordingStep(ProbeStep):
    """Says in the environment that it ran before the build, and claims every failure for its rung."""

    def before_build(self, candidate):
        os.environ["AUTOFIT_TEST_STEP"] = ",".join(sorted(self.rungs))

    def failure(self, candidate, outcome, fault, cause):
        return Outcome.INVALID, CLAIMED


NOT_A_STEP = object()


class MisspelledStep(ProbeStep):
    def read_bak(self, trainer, candidate, meter, handle, observed):  # meant: read_back; never called
        return {}
