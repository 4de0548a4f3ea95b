"""The study as optuna-dashboard reads it (issue 36, item 5): the sizes the question fixes are the study's attributes,
not parameters of every trial (the dashboard's parameter importance credited a constant max_length with 0.35); an
OOM is a Complete trial the dashboard reads as infeasible, and its trial list says so in the trial's attributes; a
study written before this change resumes without probing again."""

from __future__ import annotations

import optuna
from fakes import dashboard_getter
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from autofit.core import Outcome
from autofit.rungs import resolve_ladder
from autofit.search import STUDY_FILE, Search
from autofit.search import _store as store_module

try:
    from fakes import FormulaRunner, MiB, spec_of
except ImportError:  # pragma: no cover - run from the repository root
    from tests.fakes import FormulaRunner, MiB, spec_of


def make_spec(out_dir, budget: int, **kw):
    kw.setdefault("max_length", 512)
    kw.setdefault("effective_batch", 8)
    kw.setdefault("verify_steps", 10)
    return spec_of(model="tiny-qwen2", budget_bytes=budget, out_dir=out_dir, device="cpu", headroom=0.0,
                   predict=False, **kw)


def search(spec):
    runner = FormulaRunner(spec.budget_bytes)
    return Search(spec, runner, resolve_ladder(spec.ladder)).run(), runner


def dashboard(out_dir, study_name=None):
    """The study's page and parameter importances through optuna-dashboard's own HTTP API (the app its command
    serves), the journal opened by path."""
    get = dashboard_getter(out_dir / STUDY_FILE)

    summaries = get("/api/studies")["study_summaries"]
    study_id = next(s["study_id"] for s in summaries if study_name in (None, s["study_name"]))
    return get(f"/api/studies/{study_id}"), get(f"/api/studies/{study_id}/param_importances")


def test_the_questions_fixed_sizes_are_read_from_the_question_itself(tmp_path):
    """fixed_sizes reads SearchSpec.question_key: this pins the two together."""
    assert store_module.fixed_sizes(make_spec(tmp_path, 350 * MiB).question_key()) == {"max_length": 512}
    assert store_module.fixed_sizes(make_spec(tmp_path, 350 * MiB, min_length=128).question_key()) == {}
    assert store_module.fixed_sizes(make_spec(tmp_path, 350 * MiB, maximize="length").question_key()) == {}
    assert store_module.fixed_sizes(make_spec(tmp_path, 350 * MiB, effective_batch=1).question_key()) == {
        "max_length": 512, "micro_batch": 1}
    assert store_module.fixed_sizes("") == {}  # a question it cannot read: every size a parameter, as before


def test_the_dashboard_sees_constants_as_study_attributes_and_ooms_as_infeasible(tmp_path):
    spec = make_spec(tmp_path, 350 * MiB)
    _, runner = search(spec)
    assert {c.result.outcome for c in runner.calls} >= {Outcome.OK, Outcome.OOM}
    assert len({c.candidate.max_length for c in runner.calls}) == 1  # the length this question holds constant

    detail, importances = dashboard(tmp_path)
    study_attrs = {attr["key"]: attr["value"] for attr in detail["user_attrs"]}
    assert study_attrs["max_length"] == "512"
    trials = sorted(detail["trials"], key=lambda t: t["number"])
    assert len(trials) == len(runner.calls)
    for trial, call in zip(trials, runner.calls, strict=True):
        params = {p["name"]: p["param_external_value"] for p in trial["params"]}
        assert params == {"level": params["level"], "micro_batch": str(call.candidate.micro_batch)}
        attrs = {attr["key"]: attr["value"] for attr in trial["user_attrs"]}
        oom = call.result.outcome is Outcome.OOM
        assert trial["state"] == "Complete"  # the list's tag: an OOM is infeasible, not failed
        assert any(value > 0 for value in trial["constraints"]) == oom  # the dashboard's own test of feasibility
        assert attrs["feasible"] == "yes" if not oom else attrs["feasible"].startswith("no: out of memory at a peak")
    (per_objective,) = importances["param_importances"]
    assert {item["name"] for item in per_objective} <= {"level", "micro_batch"}  # never the constant max_length


def test_a_length_the_search_varies_stays_a_trial_parameter(tmp_path):
    spec = make_spec(tmp_path, 300 * MiB, effective_batch=1, maximize="length", min_length=128)
    _, runner = search(spec)
    assert len({c.candidate.max_length for c in runner.calls}) > 1
    storage = JournalStorage(JournalFileBackend(str(tmp_path / STUDY_FILE)))
    study = optuna.load_study(study_name=spec.study_name(), storage=storage)
    assert study.user_attrs["micro_batch"] == 1 and "max_length" not in study.user_attrs
    for trial in study.get_trials():
        assert set(trial.params) == {"level", "max_length"}
        assert trial.params["max_length"] == trial.user_attrs["candidate"]["max_length"]


def test_a_study_written_before_resumes_without_probing_again(tmp_path, monkeypatch):
    """The previous code recorded every size as every trial's parameter (what fixed_sizes returning nothing does):
    such a study resumes with every probe reused; a new trial (a longer verification) sits beside the old ones, and
    the dashboard reads the mix."""
    spec = make_spec(tmp_path, 350 * MiB)
    with monkeypatch.context() as patch:
        patch.setattr(store_module, "fixed_sizes", lambda question: {})
        first, _ = search(spec)
    storage = JournalStorage(JournalFileBackend(str(tmp_path / STUDY_FILE)))
    old = optuna.load_study(study_name=spec.study_name(), storage=storage).get_trials()
    assert old and all(set(t.params) == {"level", "micro_batch", "max_length"} for t in old)

    again, runner = search(spec)
    assert runner.calls == [] and again.probes_run == 0
    assert again.chosen.candidate == first.chosen.candidate

    longer, runner = search(make_spec(tmp_path, 350 * MiB, verify_steps=20))  # the same study, one new trial
    assert [call.steps for call in runner.calls] == [20] and longer.chosen.candidate == first.chosen.candidate
    detail, importances = dashboard(tmp_path, spec.study_name())
    names = [{p["name"] for p in t["params"]} for t in sorted(detail["trials"], key=lambda t: t["number"])]
    assert names == [{"level", "micro_batch", "max_length"}] * len(old) + [{"level", "micro_batch"}]
    assert importances["param_importances"][0]  # computed over the mix (the old trials keep what they recorded)
