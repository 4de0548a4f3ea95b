"""Rungs that cannot be used, each in its own way, for tests of the ``autofit.rungs`` entry point group."""

from autofit.rungs import QUALITY, RungBase


def not_a_rung():
    return "a function that returns a string"


class Misnamed(RungBase):
    name = "another-name"
    cost = QUALITY
    help = "calls itself by a name its entry point does not give"

    def apply(self, state):
        return None


class BadCost(Misnamed):
    name = "bad-cost"
    cost = "cheap"


class Misspelled(Misnamed):
    name = "misspelled"
    cost = "quality"

    def ledgr(self, terms, candidate):  # meant: ledger; never called
        return terms


class Shadow(Misnamed):
    name = "checkpointing"


class Twice(Misnamed):
    name = "twice"


class Faulty(Misnamed):
    """Loads, and fails in the search: its apply and its words raise."""

    name = "faulty"

    def apply(self, state):
        raise RuntimeError("boom in apply")

    def trade(self, candidate, context):
        raise KeyError("asked_length")


class Needy(Misnamed):
    name = "needy"

    def unavailable(self, device):
        raise OSError("cannot tell")


class WrongAnswer(Misnamed):
    """Loads, and answers apply() with a dict where a LadderState belongs."""

    name = "wrong-answer"

    def apply(self, state):
        return {"micro_batch": 1}


class NegativeBatch(Misnamed):
    """Loads, and sets a micro-batch of -1."""

    name = "negative-batch"

    def apply(self, state):
        return state.with_rung(self, candidate_changes={"micro_batch": -1})


class StepFails(Misnamed):
    """Loads and climbs; its probe step raises in the probe."""

    name = "step-fails"
    probe_step = "autofit_broken.probe:FailingStep"

    def apply(self, state):
        return state.with_rung(self, candidate_changes={"optim": "sgd"})
