"""The engine contract (issue 58, item 2), held by every engine of the registry (``autofit.core._engines``): its facts
hold together, its files read back as itself through the launch's own reader, and the memory and speed models price
what it says it shards and offloads, nothing named here."""

from __future__ import annotations

import pytest

from autofit import memory_model as mm
from autofit.core import DDP, ENGINES, Candidate, card_named, engine_for
from autofit.launch import launch_engine, read_accelerate_config
from autofit.rungs import write_engine_files

BASE = Candidate("sft", "tiny-qwen2", "cuda", micro_batch=8, grad_accum=1, max_length=128, ranks=2)
SHAPE = mm.ModelShape.from_model("tiny-qwen2")


@pytest.fixture(params=sorted(ENGINES), ids=str)
def engine(request):
    return ENGINES[request.param]


def under(engine) -> Candidate:
    """BASE run under the engine: as the optimizer-offload rung sets it, a sharding rung, or data parallel."""
    if engine.optimizer_offload:
        return BASE.replace(offload=engine.name)
    return BASE.replace(sharding=engine.name) if engine.sharding else BASE


def test_its_facts_hold_together_and_name_it(engine):
    assert engine.deepspeed == (engine.stage > 0) and not (engine.deepspeed and engine.fsdp)
    assert not engine.shards_parameters or engine.shards_gradients  # ZeRO-3 holds what ZeRO-2 does, and so on
    assert not engine.shards_gradients or engine.shards_optimizer
    assert not engine.offloads_parameters or engine.shards_parameters
    assert not engine.sharding or engine.help  # a sharding rung says what it does
    # the one mapping from a stage and its offloads to a name gives this engine back
    assert engine_for(engine.stage, engine.offloads_optimizer, engine.offloads_parameters, engine.fsdp) == engine.name
    assert (under(engine).engine or DDP) == engine.name


def test_its_files_read_back_as_itself(engine, tmp_path):
    paths = write_engine_files(tmp_path, engine.name, ranks=2)
    found = launch_engine({}, {}, {}, door_file=read_accelerate_config(str(paths["accelerate"])))
    assert (found.sharding or DDP) == engine.name and found.processes == 2
    assert ("deepspeed" in paths) == engine.deepspeed


def test_the_models_price_what_it_shards_and_offloads(engine):
    base, ledger = mm.predict(BASE, SHAPE), mm.predict(under(engine), SHAPE)
    for shards, term in ((engine.shards_optimizer, "optimizer"), (engine.shards_gradients, "gradients"),
                         (engine.shards_parameters, "weights")):
        if shards or (term == "optimizer" and engine.offloads_optimizer):
            assert getattr(ledger, term) < getattr(base, term), term
    assert (mm.host_bytes(under(engine), SHAPE, "cuda") > 0) == engine.offloads_optimizer
    seconds = mm.predict_speed(under(engine), SHAPE, card_named("H100")).terms
    assert ("optimizer (host)" in seconds) == engine.offloads_optimizer
    assert (seconds.get("parameter gathers", 0) > 0) == engine.shards_parameters
