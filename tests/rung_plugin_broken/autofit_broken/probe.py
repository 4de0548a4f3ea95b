"""The probe step of the ``step-fails`` rung: it raises in its own code once the trainer is built."""

from autofit.rungs import ProbeStep


class FailingStep(ProbeStep):
    def after_build(self, trainer, candidate, observed):
        raise RuntimeError("boom in the step")
