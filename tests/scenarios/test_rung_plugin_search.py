"""A rung of another package, end to end (issue 38, item 3): ``tests/rung_plugin`` (Adafactor, installed by its
dist-info's ``autofit.rungs`` entry point, no file of autofit touched) is searched when ``--ladder`` names it, probed
with its own step (which checks the trainer took ``optim=adafactor`` and reads the optimizer's states back),
predicted with its own ledger term, and explained in best.yaml and best.json in its own words. A real search of
tiny-qwen2 on the CPU meter: at 125 MiB a micro-batch of 1 does not fit with AdamW and does with Adafactor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autofit import cli
from autofit import memory_model as mm
from autofit.core import Candidate

pytestmark = pytest.mark.slow

PLUGIN = Path(__file__).resolve().parents[1] / "rung_plugin"
MiB = 2**20


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.syspath_prepend(str(PLUGIN))  # installed: importlib.metadata finds the dist-info; probes inherit sys.path
    try:
        out = tmp_path_factory.mktemp("adafactor")
        code = cli.main(["search", "--model", "tiny-qwen2", "--device", "cpu", "--max-length", "128",
                         "--gpu-memory", "125MiB", "--ladder", "micro-batch,adafactor", "--verify-steps", "3",
                         "--out", str(out)])
        yield code, out, json.loads((out / "best.json").read_text())
    finally:
        patch.undo()


def test_the_packages_rung_is_searched_and_chosen(searched):
    code, _, best = searched
    assert code == 0 and best["fits"], best.get("notes")
    assert best["rungs"] == ["micro-batch", "adafactor"]
    config = best["config"]
    assert config["optim"] == "adafactor"
    assert config["per_device_train_batch_size"] * config["gradient_accumulation_steps"] == 8
    # AdamW at the micro-batch level did not fit: probed out of memory, or ruled out by the memory model
    adamw = [c for c in best["candidates"] if "adafactor" not in c["rungs"]]
    assert all(c["outcome"] != "OK" for c in adamw)


def test_its_words_explain_best_yaml_and_the_trades(searched):
    _, out, best = searched
    assert ('optim: "adafactor"  # adafactor: a row and a column of second moments per matrix instead of AdamW\'s two '
            "full states") in (out / "best.yaml").read_text()
    trade = "Adafactor replaces AdamW: no momentum and a factored second moment"
    assert any(t.startswith(trade) for t in best["trades"])


def test_its_probe_step_read_the_optimizer_back(searched):
    from autofit_adafactor import factored_state_bytes

    _, _, best = searched
    stats = best["verified"]["stats"]
    assert stats["optimizer_class"] == "Adafactor"
    chosen = Candidate(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=1, grad_accum=8, max_length=128,
                       optim="adafactor")
    shape = mm.ModelShape.from_model("tiny-qwen2")
    facts = mm.ModelFactsOf(shape, chosen)  # what the memory model hands a rung's ledger
    assert stats["optimizer_state_bytes"] == pytest.approx(factored_state_bytes(facts, chosen), rel=0.01)


def test_its_ledger_term_predicts_the_measured_peak(searched):
    _, _, best = searched
    config = best["config"]
    chosen = Candidate(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=config["per_device_train_batch_size"],
                       grad_accum=config["gradient_accumulation_steps"], max_length=128, optim="adafactor",
                       rungs=("micro-batch", "adafactor"))
    patch = pytest.MonkeyPatch()
    patch.syspath_prepend(str(PLUGIN))
    try:
        predicted = mm.predict(chosen).total
        table = mm.predict(chosen.replace(rungs=("micro-batch",))).total  # optim=adafactor, the table's 4 B/param
    finally:
        patch.undo()
    assert best["peak_bytes"] == pytest.approx(predicted, rel=0.05)
    assert table - predicted > 20 * MiB  # the rung's own term, not the table's
    # the search's own prediction before each Adafactor probe (uncalibrated), against what the probe measured
    for probe in [c for c in best["candidates"] if "adafactor" in c["rungs"]]:
        assert probe["prior_predicted_bytes"] == pytest.approx(probe["peak_bytes"], rel=0.05)
