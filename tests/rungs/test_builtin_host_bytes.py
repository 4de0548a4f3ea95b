"""The built-in rungs through the plugin contract's hooks: the offloading rungs say their host memory with
``host_bytes`` (the memory model sums every rung's), ``modelled`` (not a name check) keeps their band and notes
away, and their probe steps say ``keeps_host`` for the simulated device's meter."""

from __future__ import annotations

from autofit import memory_model as mm
from autofit.core import Candidate
from autofit.rungs import (
    DEFAULT_LADDER,
    QUALITY,
    RUNGS,
    ActivationOffload,
    OptimizerOffload,
    RungBase,
    Sharding,
    carried_rungs,
    register,
)
from autofit.rungs.engines import ZERO2_OFFLOAD


def candidate(**changes) -> Candidate:
    fields = dict(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=4, grad_accum=1, max_length=128)
    fields.update(changes)
    return Candidate(**fields)


SHAPE = mm.ModelShape.from_model("tiny-qwen2")


def test_each_offloading_rungs_hook_is_the_memory_models_host_bytes():
    cases = [
        (OptimizerOffload(), candidate(offload=ZERO2_OFFLOAD, grad_accum=2), "cuda"),
        (ActivationOffload(), candidate(activation_offload=True, checkpointing=True), "cpu"),
        (Sharding("zero3-offload"), candidate(ranks=2, sharding="zero3-offload"), "cuda"),
        (Sharding("fsdp2-offload"), candidate(ranks=2, sharding="fsdp2-offload"), "cuda"),
    ]
    for rung, carrying, device in cases:
        own = rung.host_bytes(carrying, mm.ModelFactsOf(SHAPE, carrying, device))
        assert own > 0, rung.name
        assert mm.host_bytes(carrying, SHAPE, device) == own, rung.name
        # a candidate that does not carry it: nothing
        assert rung.host_bytes(candidate(), mm.ModelFactsOf(SHAPE, candidate(), device)) == 0, rung.name
    assert mm.host_bytes(candidate(), SHAPE, "cuda") == 0


def test_a_user_config_carrying_a_rungs_field_without_its_name_counts_its_host_bytes():
    carrying = candidate(offload=ZERO2_OFFLOAD)  # a level 0 of the user's: the field, no rung named
    assert not carrying.rungs
    assert mm.host_bytes(carrying, SHAPE, "cuda") > 0


def test_the_candidates_rungs_are_every_built_in_then_those_it_names():
    class Named(RungBase):
        name, cost, help = "named-custom", QUALITY, "named"

        def apply(self, state):
            return state.with_rung(self)

    register(Named())
    rungs = carried_rungs(candidate(rungs=("lora", "named-custom", "no-such-rung")))
    assert rungs[: len(RUNGS)] == list(RUNGS.values())
    assert [r.name for r in rungs[len(RUNGS):]] == ["named-custom"]


def test_built_in_rungs_say_they_are_modelled_and_get_no_band_nor_note():
    assert all(rung.modelled for rung in DEFAULT_LADDER)
    assert all(mm.rung_band(rung) is None for rung in DEFAULT_LADDER)
    assert mm.rung_notes(DEFAULT_LADDER) == []

    class Unsaid(RungBase):
        name, cost, help = "unsaid-custom", QUALITY, "says nothing of its memory"

    class Said(Unsaid):
        name, modelled = "said-custom", True

    assert mm.rung_band(Unsaid()) is not None and len(mm.rung_notes([Unsaid()])) == 1
    assert mm.rung_band(Said()) is None and mm.rung_notes([Said()]) == []


def test_the_probe_steps_that_keep_host_storages_say_so_for_the_meter():
    from autofit.rungs import ProbeStep
    from autofit.rungs.activation_offload._probe import ActivationOffloadStep
    from autofit.rungs.engines._probe import EngineStep

    assert EngineStep().keeps_host(candidate(offload=ZERO2_OFFLOAD))
    assert not EngineStep().keeps_host(candidate(ranks=2, sharding="fsdp2"))
    assert ActivationOffloadStep().keeps_host(candidate(activation_offload=True))
    assert not ProbeStep().keeps_host(candidate(offload=ZERO2_OFFLOAD))
