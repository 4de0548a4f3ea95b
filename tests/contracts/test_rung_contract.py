"""The rung contract, held by every rung: the built-in ones (every variant the ladder or a name reaches) and a rung of
another package (tests/rung_plugin). A rung is one unit (autofit.rungs._contract): its name, cost class and help,
``apply``, its words for best.yaml and best.json, its probe step, its ledger effect and host bytes, what it needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autofit import memory_model as mm
from autofit.core import Candidate, card_named, keys_of
from autofit.core._knob_table import KNOBS
from autofit.rungs import COSTS, DEFAULT_LADDER, RUNGS, LadderState, ProbeStep, RungBase, hook_problem

PLUGIN = Path(__file__).resolve().parents[1] / "rung_plugin"


def _plugin():
    sys.path.insert(0, str(PLUGIN))
    try:
        from autofit.rungs import resolve_ladder

        return resolve_ladder(["adafactor"])[0]
    finally:
        sys.path.remove(str(PLUGIN))


ALL = {**{rung.name: rung for rung in DEFAULT_LADDER}, **RUNGS, "adafactor (tests/rung_plugin)": _plugin()}
BASE = Candidate("sft", "tiny-qwen2", "cuda", micro_batch=8, grad_accum=1, max_length=128, ranks=2)
# GRPO with a colocated vLLM at TRL's share of two 80 GB cards: the vLLM rungs' first level
VLLM = Candidate("grpo", "tiny-qwen2", "cuda", micro_batch=8, grad_accum=1, max_length=128, prompt_length=32,
                 num_generations=4, vllm="colocate", vllm_utilization=0.3, vllm_share_bytes=int(0.3 * 80e9), ranks=2)


# The first levels a rung is tried on, in order: SFT, DPO (a reference model) and GRPO with vLLM; each rung applies to
# one of them, and the contract holds it there (no rung is named here).
FIRST_LEVELS = (BASE, BASE.replace(algo="dpo"), VLLM)


def _state(candidate: Candidate) -> LadderState:
    shape = mm.ModelShape.from_model("tiny-qwen2")
    return LadderState(candidate, min_length=16, vllm_need=lambda c: int(mm.vllm_need(c, shape)),
                       vllm_server_fits=lambda c, gpus: mm.server_fits(c, shape, int(80e9), gpus))


def _first(rung) -> Candidate:
    """The first of ``FIRST_LEVELS`` the rung applies to (the first of all where none: the tests then fail there)."""
    return next((level for level in FIRST_LEVELS if rung.apply(_state(level)) is not None), BASE)


def _applied(rung):
    """The rung applied to its first level (None where it applies to none)."""
    return rung.apply(_state(_first(rung)))


@pytest.fixture(params=sorted(ALL), ids=str)
def rung(request):
    return ALL[request.param]


def test_it_says_who_it_is_and_has_no_misspelled_hook(rung):
    assert isinstance(rung.name, str) and rung.name and isinstance(rung.help, str) and rung.help
    assert rung.cost in COSTS
    assert hook_problem(rung, RungBase) is None
    assert set(getattr(rung, "knobs", ())) <= {k.name for k in KNOBS}


def test_apply_adds_its_name_and_never_lowers_the_cost(rung):
    state = _applied(rung)
    assert state is not None  # every rung applies to one first level (two GPUs, a batch to split, on CUDA)
    assert state.candidate.rungs[-1] == rung.name
    assert COSTS.index(state.cost) >= COSTS.index(rung.cost) or getattr(rung, "runs_an_engine", False)
    again = rung.apply(state)  # a rung applies once, or steps on (a smaller micro-batch) under its one name
    assert again is None or (again.candidate != state.candidate and again.candidate.rungs.count(rung.name) == 1)


def test_its_words_are_sentences_or_nothing(rung):
    candidate = _applied(rung).candidate
    trade = rung.trade(candidate, {"asked_length": 128}) if hasattr(rung, "trade") else None
    assert trade is None or (isinstance(trade, str) and trade)
    for key in keys_of(*getattr(rung, "knobs", ())):  # best.yaml's comment on each key of its knobs
        comment = rung.comment(key, candidate)
        assert isinstance(comment, str) and comment, key


def test_its_probe_step_loads_in_the_child_with_the_steps_hooks(rung):
    path = getattr(rung, "probe_step", None)
    if path is None:
        return
    sys.path.insert(0, str(PLUGIN))  # where the other package's rung lives; a built-in's step loads as well
    try:
        from autofit.probe import _steps as steps

        step = steps.load(path, frozenset({rung.name}))
    finally:
        sys.path.remove(str(PLUGIN))
    assert isinstance(step, ProbeStep) and hook_problem(step, ProbeStep) is None and rung.name in step.rungs


def test_it_says_whether_this_machine_runs_it(rung):
    for device in ("cpu", "cuda"):
        reason = rung.unavailable(device) if hasattr(rung, "unavailable") else None
        assert reason is None or (isinstance(reason, str) and reason)


def test_its_memory_is_the_ledgers_or_a_band(rung):
    """The ledger prices its level (built-ins through the candidate's fields, another package's by its ledger or its
    band), host bytes included where it keeps some."""
    state = _applied(rung)
    ledger = mm.predict(state.candidate)
    assert ledger.total > 0 and ledger.uncertainty > 0
    shape = mm.ModelShape.from_model("tiny-qwen2")
    assert mm.host_bytes(state.candidate, shape, "cpu") >= 0
    if getattr(rung, "host_memory", ""):
        assert mm.host_bytes(state.candidate, shape, "cuda") > 0, rung.name


def priced(before: Candidate, after: Candidate) -> bool:
    """Whether the memory model or the speed model prices ``after`` otherwise than ``before``: a phase's peak, the host
    bytes, or the seconds of a step on an H100."""
    shape = mm.ModelShape.from_model("tiny-qwen2")
    memory = [(ledger.phase, round(ledger.total)) for ledger in mm.phase_ledgers(before, shape)] != \
        [(ledger.phase, round(ledger.total)) for ledger in mm.phase_ledgers(after, shape)]
    host = mm.host_bytes(before, shape, "cuda") != mm.host_bytes(after, shape, "cuda")
    card = card_named("H100")
    speed = [mm.predict_speed(c, shape, card).seconds_per_step for c in (before, after)]
    return memory or host or speed[0] != speed[1]


def test_its_effect_is_priced_or_it_says_where(rung):
    """Issue 58, item 2: where a rung applies, the ledger or the speed model prices its level otherwise than the level
    before (a rung whose effect a term forgot is caught here), or the rung says why its first candidate is the same."""
    said = getattr(rung, "priced_by_its_search", "")
    assert isinstance(said, str)
    assert priced(_first(rung), _applied(rung).candidate) or said, rung.name


class _Halves(RungBase):
    """A rung of a package's: it halves the saved activations (a knob the memory model does not know, so its effect
    is its ``ledger``'s)."""

    name = "halves-activations (test)"
    cost = "quality"
    help = "saved activations halved"

    def apply(self, state):
        return state.with_rung(self, candidate_changes={"env": (("HALVES_ACTIVATIONS", "1"),)})

    def ledger(self, terms, candidate, model):
        return {**terms, "activations": terms.get("activations", 0) // 2}


class _Forgetful(_Halves):
    name = "forgets-its-term (test)"

    def ledger(self, terms, candidate, model):
        return terms  # the term forgotten


@pytest.mark.parametrize("rung_class, is_priced", [(_Halves, True), (_Forgetful, False)], ids=["priced", "forgot"])
def test_a_rung_whose_ledger_forgets_its_term_fails_the_effect_check(rung_class, is_priced):
    from autofit.rungs import _default, register

    rung = rung_class()
    register(rung)  # known by its name to the stages, as fit(ladder=[...]) makes a rung object known
    try:
        assert priced(BASE, rung.apply(LadderState(BASE, min_length=16)).candidate) is is_priced
    finally:
        _default._REGISTERED.pop(rung.name, None)


class _Slower(RungBase):
    """A rung of a package's: its kernels add a tenth of a second to every step (an effect only its ``speed`` says)."""

    name = "slower-kernels (test)"
    cost = "speed"
    help = "a kernel of its own"

    def apply(self, state):
        return state.with_rung(self, candidate_changes={"env": (("SLOWER_KERNELS", "1"),)})

    def speed(self, seconds, candidate, model):
        return {**seconds, "its kernels": 0.1}


class _ForgetsItsSpeed(_Slower):
    name = "forgets-its-speed (test)"

    def speed(self, seconds, candidate, model):
        return seconds  # the part forgotten


@pytest.mark.parametrize("rung_class, is_priced", [(_Slower, True), (_ForgetsItsSpeed, False)],
                         ids=["priced", "forgot"])
def test_a_rung_whose_speed_forgets_its_part_fails_the_effect_check(rung_class, is_priced):
    from autofit.rungs import _default, register

    rung = rung_class()
    register(rung)
    try:
        after = rung.apply(LadderState(BASE, min_length=16)).candidate
        assert priced(BASE, after) is is_priced
        seconds = mm.predict_speed(after, mm.ModelShape.from_model("tiny-qwen2"), card_named("H100")).terms
        assert ("its kernels" in seconds) is is_priced and seconds.get("its kernels", 0.1) == 0.1
    finally:
        _default._REGISTERED.pop(rung.name, None)
