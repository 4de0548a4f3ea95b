"""Rungs of other packages (the ``autofit.rungs`` entry point group) and of the caller (``fit(ladder=[obj])``): found
by name, never in the default ladder, a broken package one line naming it, and their ledger effect or band in the
memory model. ``tests/rung_plugin`` is an installed package when its folder is on ``sys.path`` (its ``*.dist-info``
declares the entry point); ``tests/rung_plugin_broken`` holds packages whose rungs cannot be used, each its own way.
The end-to-end search with the plugin's rung is in ``tests/scenarios/test_rung_plugin_search.py``."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from autofit import cli
from autofit import memory_model as mm
from autofit.core import Candidate, InputError
from autofit.rungs import (
    DEFAULT_LADDER,
    QUALITY,
    LadderState,
    PluginError,
    RungBase,
    accepted_names,
    register,
    resolve_ladder,
    rung_named,
)

TESTS = Path(__file__).resolve().parents[1]
PLUGIN = TESTS / "rung_plugin"
BROKEN = TESTS / "rung_plugin_broken"
MiB = 2**20


@pytest.fixture
def installed(monkeypatch):
    """tests/rung_plugin installed: its folder on sys.path (importlib.metadata reads it from there)."""
    monkeypatch.syspath_prepend(str(PLUGIN))
    yield


@pytest.fixture
def broken(monkeypatch):
    monkeypatch.syspath_prepend(str(BROKEN))
    yield


def candidate(**changes) -> Candidate:
    fields = dict(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=4, grad_accum=1, max_length=128)
    fields.update(changes)
    return Candidate(**fields)


# -- found by name, used when named -----------------------------------------------------------------------------------
def test_a_packages_rung_is_named_in_the_ladder_and_listed_but_not_in_the_default_ladder(installed):
    assert "adafactor" in accepted_names() and "adafactor" not in [r.name for r in DEFAULT_LADDER]
    assert [r.name for r in resolve_ladder(None)] == [r.name for r in DEFAULT_LADDER]
    micro, adafactor = resolve_ladder(["micro-batch", "adafactor"])
    assert type(adafactor).__module__ == "autofit_adafactor" and rung_named("adafactor") is adafactor
    state = adafactor.apply(LadderState(candidate()))
    assert state.candidate.optim == "adafactor" and state.rungs == ("adafactor",) and state.cost == QUALITY


def test_the_help_lists_the_names_installed_packages_offer(installed, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: no name cut at its hyphen
    with pytest.raises(SystemExit):
        cli.main(["estimate", "--help"])
    out = capsys.readouterr().out
    assert "; accepted: expandable-segments, liger-kernels, " in out and ", shorter-length, adafactor\n" in out


def test_without_the_package_the_name_is_unknown():
    with pytest.raises(ValueError, match="unknown ladder rung 'adafactor': accepted are expandable-segments"):
        resolve_ladder(["adafactor"])
    assert rung_named("adafactor") is None


@pytest.mark.parametrize("name, says", [
    ("missing", "rung 'missing' of package autofit-broken 0.1 (entry point autofit.rungs: missing = autofit_broken"
                ".gone:Rung) cannot be imported: ModuleNotFoundError: No module named 'autofit_broken.gone'"),
    ("not-a-rung", "is not a rung: function has no name, cost, help, apply()"),
    ("misnamed", "calls itself 'another-name': the entry point's name must be the rung's"),
    ("bad-cost", "has the cost class 'cheap': accepted are free, speed, quality"),
    ("misspelled", "Misspelled defines ledgr, which is no hook of RungBase (its hooks: apply, comment, host_bytes, "
                   "ledger, speed, trade, unavailable)"),
    ("twice", "rung 'twice' is offered by package autofit-twin 0.2 and package autofit-broken 0.1"),
])
def test_a_broken_package_named_in_the_ladder_is_one_line_naming_it(broken, name, says):
    with pytest.raises(PluginError) as caught:
        resolve_ladder(["micro-batch", name])
    assert says in str(caught.value) and "\n" not in str(caught.value)
    assert rung_named(name) is None  # met elsewhere (a stored candidate's rung): unknown, said once in the log


def test_a_broken_package_not_named_costs_nothing_and_a_built_in_name_stays_the_built_ins(broken, caplog,
                                                                                          monkeypatch):
    monkeypatch.setattr("autofit.rungs._plugins._SAID", set())  # said once a process: again here
    with caplog.at_level(logging.WARNING, logger="autofit.rungs"):
        assert [r.name for r in resolve_ladder(["micro-batch", "checkpointing"])] == ["micro-batch", "checkpointing"]
        assert type(resolve_ladder(["checkpointing"])[0]).__module__ == "autofit.rungs._checkpointing"
        names = accepted_names()
    assert names.count("checkpointing") == 1 and "missing" in names  # listed, never imported
    assert "the rung 'checkpointing' of package autofit-broken 0.1 (entry point autofit.rungs) is ignored: autofit " \
           "has a built-in rung of that name" in caplog.text


def test_the_command_line_refuses_a_broken_rung_in_one_line(broken, capsys):
    code = cli.main(["estimate", "--model", "tiny-qwen2", "--gpu-memory", "1GiB", "--ladder", "micro-batch,missing"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "rung 'missing' of package autofit-broken 0.1" in err and "No module named 'autofit_broken.gone'" in err


# -- the caller's rungs: registered by fit -----------------------------------------------------------------------------
class Plain:
    """A rung that follows the protocol only: it says nothing of its memory."""

    name, cost, help = "plain-custom", QUALITY, "a custom rung"

    def apply(self, state):
        return state.with_rung(self)


def test_register_makes_a_rung_known_and_refuses_a_built_in_name():
    register(Plain())
    assert isinstance(rung_named("plain-custom"), Plain)

    class Impostor(Plain):
        name = "checkpointing"

    with pytest.raises(ValueError, match="is named 'checkpointing', a built-in rung's name"):
        register(Impostor())
    register(resolve_ladder(["checkpointing"])[0])  # the built-in itself: nothing to register
    assert type(rung_named("checkpointing")).__name__ == "GradientCheckpointing"


def test_fit_refuses_a_rung_under_a_built_in_name(tmp_path):
    import autofit

    class Impostor(Plain):
        name = "lora"

    with pytest.raises(InputError, match="a built-in rung's name"):
        autofit.fit(lambda c: None, model="tiny-qwen2", device="cpu", gpu_memory="1GiB", out_dir=tmp_path,
                    ladder=["micro-batch", Impostor()])


# -- the memory model: the rung's own term, or its band ---------------------------------------------------------------
def test_the_packages_ledger_gives_its_own_optimizer_term(installed):
    adafactor = resolve_ladder(["adafactor"])[0]
    plain = candidate()
    table = mm.predict(plain.replace(optim="adafactor"))  # optim alone: the memory model's table (4 B/param)
    with_rung = mm.predict(adafactor.apply(LadderState(plain)).candidate)
    # the factored states of tiny-qwen2 (2 layers, hidden 256, vocab 8192): 0.11 MiB, not the table's 21.6 MiB
    assert with_rung.optimizer == pytest.approx(0.109 * MiB, rel=0.02)
    assert table.total - with_rung.total == pytest.approx(table.optimizer - with_rung.optimizer)
    assert with_rung.uncertainty == table.uncertainty  # described: no wider band
    assert mm.rung_notes([adafactor]) == []


class Banded(Plain):
    name, band = "banded-custom", 0.4


class Failing(RungBase):
    name, cost, help = "failing-custom", QUALITY, "its ledger raises"

    def apply(self, state):
        return state.with_rung(self)

    def ledger(self, terms, candidate):
        raise KeyError("weights")


def test_a_rung_without_a_ledger_widens_the_band_and_a_note_names_it(caplog):
    for rung in (Plain(), Banded(), Failing()):
        register(rung)
    base = mm.predict(candidate())
    plain = mm.predict(Plain().apply(LadderState(candidate())).candidate)
    banded = mm.predict(Banded().apply(LadderState(candidate())).candidate)
    assert plain.total == base.total and plain.uncertainty == 0.5 and banded.uncertainty == 0.4
    assert mm.rung_notes([Plain(), Banded(), *resolve_ladder(["lora"])]) == [
        "memory model: the rung plain-custom is not modelled (no ledger of its own): predictions with it carry a "
        "±50% band until probes calibrate them",
        "memory model: the rung banded-custom is not modelled (no ledger of its own): predictions with it carry a "
        "±40% band until probes calibrate them",
    ]
    with caplog.at_level(logging.WARNING, logger="autofit.memory_model"):
        failing = mm.predict(Failing().apply(LadderState(candidate())).candidate)
    assert failing.total == base.total and failing.uncertainty == 0.5
    assert "the ledger of the rung failing-custom failed (KeyError: 'weights'): it is treated as not modelled" \
        in caplog.text


def test_the_search_and_the_estimate_name_a_rung_the_memory_model_does_not_describe(tmp_path, capsys):
    from autofit.search import Search

    try:
        from fakes import FormulaRunner, formula_spec
    except ImportError:  # tests/ became a package
        from tests.fakes import FormulaRunner, formula_spec

    register(Plain())
    note = "memory model: the rung plain-custom is not modelled (no ledger of its own): predictions with it carry a " \
           "±50% band until probes calibrate them"
    search = Search(formula_spec(tmp_path, 2**30), FormulaRunner(2**30), [*resolve_ladder(["micro-batch"]), Plain()])
    assert note in search.report.notes
    assert cli.main(["estimate", "--model", "tiny-qwen2", "--gpu-memory", "1GiB", "--ladder",
                     "micro-batch,plain-custom"]) == 0
    assert f"note: {note}" in capsys.readouterr().out


def test_a_packages_rung_failing_in_the_search_is_one_line_naming_it(broken, caplog, capsys):
    from autofit.rungs import usable_rungs

    faulty, needy = resolve_ladder(["faulty", "needy"])
    with pytest.raises(PluginError, match=r"^rung 'faulty' of package autofit-broken 0.1: its apply\(\) failed: "
                                          r"RuntimeError: boom in apply$"):
        faulty.apply(LadderState(candidate()))
    with caplog.at_level(logging.WARNING, logger="autofit.rungs"):
        assert faulty.trade(candidate(), {}) is None  # its words failing: it says nothing, logged once
    assert "rung 'faulty' of package autofit-broken 0.1: its trade() failed: KeyError" in caplog.text
    usable, notes = usable_rungs([needy], "cpu")
    assert usable == [] and notes == ["rung needy left out: its unavailable() failed: OSError: cannot tell"]
    code = cli.main(["estimate", "--model", "tiny-qwen2", "--gpu-memory", "1GiB", "--ladder", "micro-batch,faulty"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "its apply() failed: RuntimeError: boom in apply" in err


@pytest.mark.parametrize("name,problem", [
    ("wrong-answer", "its apply() returned dict, not None or a LadderState"),
    ("negative-batch", "micro_batch"),
])
def test_a_packages_rung_that_answers_wrongly_is_named_before_any_probe(broken, tmp_path, capsys, name, problem):
    """Issue 50, item 3: apply() returning a dict was a traceback; a micro-batch of -1 was probed as mb=-1x-8."""
    try:
        from fakes import FormulaRunner, formula_spec
    except ImportError:  # tests/ became a package
        from tests.fakes import FormulaRunner, formula_spec
    from autofit.search import Search

    [rung] = resolve_ladder([name])
    with pytest.raises(PluginError, match=rf"^rung '{name}' of package autofit-broken 0.1: .*{re.escape(problem)}"):
        rung.apply(LadderState(candidate()))
    runner = FormulaRunner(2**20)  # nothing fits at the first level: the search climbs to the broken rung
    with pytest.raises(PluginError, match=re.escape(problem)):
        Search(formula_spec(tmp_path, 2**20), runner, resolve_ladder(["micro-batch", name])).run()
    assert all(c.micro_batch >= 1 and c.grad_accum >= 1 for c in runner.candidates)
    code = cli.main(["estimate", "--model", "tiny-qwen2", "--gpu-memory", "1GiB", "--ladder", f"micro-batch,{name}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1 and "autofit-broken 0.1" in err, err


@pytest.mark.slow
def test_a_packages_probe_step_that_fails_is_the_packages_fault(broken, tmp_path):
    """Issue 50, item 3: a plugin's probe step raising ended in "nothing fits ... even with <rung>" (exit 3). The
    probe says whose fault it is, and the search stops on it naming the package (exit 2)."""
    from autofit.core import PLUGIN, Outcome, ProbeSettings
    from autofit.probe._worker import run_probe
    from autofit.probe.algos import sft
    from autofit.search._faults import FaultWatch

    path = "autofit_broken.probe:FailingStep"
    what = f"its probe step {path} failed in after_build(): RuntimeError: boom in the step"
    probe = ProbeSettings(steps=1, output_dir=str(tmp_path / "probe"), rung_steps=(("step-fails", path),))
    stepping = candidate(max_length=32, micro_batch=1, rungs=("step-fails",), probe=probe)
    result = run_probe(sft.build_trainer, stepping, None)
    assert result.outcome is Outcome.CRASH and result.fault == PLUGIN, result.error
    assert f"rung 'step-fails' of package autofit-broken 0.1: {what}" in result.error
    with pytest.raises(PluginError, match=r"^rung 'step-fails' of package autofit-broken 0.1: its probe step"):
        FaultWatch(user_factory=False).observe(stepping, result)


def test_a_packages_rung_whose_every_probe_is_refused_is_no_claim_that_nothing_fits(broken, tmp_path):
    """Issue 50, item 3: a plugin rung whose only probes were INVALID ended in "nothing fits ... even with <rung>":
    a claim about a rung that measured nothing. The message names the deepest level measured, and the rung, its
    package and the refusal as not measured."""
    try:
        from fakes import FormulaRunner, formula_spec
    except ImportError:  # tests/ became a package
        from tests.fakes import FormulaRunner, formula_spec
    from autofit._api import no_fit_message
    from autofit.core import Outcome
    from autofit.search import Search

    runner = FormulaRunner(2**20, fail_if=lambda c, steps: Outcome.INVALID if "step-fails" in c.rungs else None)
    report = Search(formula_spec(tmp_path, 2**20), runner, resolve_ladder(["micro-batch", "step-fails"])).run()
    assert not report.fits and any("step-fails" in c.rungs for c in runner.candidates)
    message = no_fit_message(report)
    assert message.startswith("nothing fits in 1.00 MiB even with micro-batch: "), message
    assert "; not measured: step-fails of package autofit-broken 0.1, every probe of its level refused (" in message


# -- the plugin's surface --------------------------------------------------------------------------------------------
def test_the_plugin_imports_only_the_declared_api():
    """A rung of another package needs nothing of autofit beyond ``autofit.rungs.PLUGIN_API`` (its ledger gets the
    model's facts handed in): tests/rung_plugin holds to it, so a refactor of the memory model breaks no plugin."""
    import ast

    from autofit import rungs

    assert all(getattr(rungs, name, None) is not None for name in rungs.PLUGIN_API)
    for path in sorted((PLUGIN / "autofit_adafactor").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert not [a.name for a in node.names if a.name.startswith("autofit")], (path.name, ast.dump(node))
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autofit"):
                assert node.module == "autofit.rungs", (path.name, node.module)
                assert {a.name for a in node.names} <= set(rungs.PLUGIN_API), (path.name, [a.name for a in node.names])


class Parking(RungBase):
    """A rung of the caller's that keeps a quarter of the weights in host memory."""

    name, cost, help, host_memory = "parking-custom", QUALITY, "parks a quarter of the weights", "parked weights"

    def apply(self, state):
        return state.with_rung(self)

    def host_bytes(self, candidate, model):
        return model.parameters * model.weight_bytes // 4


def test_a_rungs_host_bytes_are_counted_and_checked_against_the_machine():
    from autofit.search._host_memory import host_shortfalls

    register(Parking())
    shape = mm.ModelShape.from_model("tiny-qwen2")
    parked = Parking().apply(LadderState(candidate())).candidate
    quarter = mm.census_for(shape, "sft").total * 4 // 4  # float32 weights
    assert mm.host_bytes(parked, shape, "cpu") == pytest.approx(mm.host_bytes(candidate(), shape, "cpu") + quarter)
    start = LadderState(candidate())
    assert host_shortfalls(start, [Parking()], shape, "cpu", available=quarter - 1)[0][0] == "parking-custom"
    assert host_shortfalls(start, [Parking()], shape, "cpu", available=quarter * 2) == []


def test_a_callers_rung_with_a_misspelled_hook_is_refused_when_registered():
    class Typo(RungBase):
        name, cost, help = "typo-custom", QUALITY, "its ledger is misspelled"

        def apply(self, state):
            return state.with_rung(self)

        def unavailble(self, device):  # meant: unavailable
            return "never said"

    with pytest.raises(ValueError, match="your rung 'typo-custom': Typo defines unavailble, which is no hook"):
        register(Typo())
