"""What decides whether a stored probe is still valid (issue 35, item 10): the fingerprint left out autofit's own
version, flash-attn, liger-kernel and triton, the allocator's environment variables and the driver; a user's
factory was named by that one function's bytecode alone (not the helpers it calls, its module's globals or the
data files it loads). Each of these can change a peak, and each now changes the fingerprint or the identity."""

import textwrap
from pathlib import Path

from autofit.probe._factory import identity
from autofit.search import _store
from autofit.search._store import MEASURING_PACKAGES, fingerprint

CONFIG = {"model_type": "qwen2", "hidden_size": 64}


def test_autofit_and_the_kernel_libraries_are_in_the_fingerprint(monkeypatch):
    for package in ("trl-autofit", "flash-attn", "liger-kernel", "triton"):
        assert package in MEASURING_PACKAGES
    before = fingerprint(CONFIG, "cpu")
    real = _store.installed_versions

    def other_autofit(packages):
        found = real(packages)
        found["trl-autofit"] = "99.0"
        return found

    monkeypatch.setattr(_store, "installed_versions", other_autofit)
    assert fingerprint(CONFIG, "cpu") != before


def test_the_allocator_environment_and_the_driver_are_in_the_fingerprint(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    plain = fingerprint(CONFIG, "cuda", "H100", "550.54")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert fingerprint(CONFIG, "cuda", "H100", "550.54") != plain
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert fingerprint(CONFIG, "cuda", "H100", "560.28") != plain
    assert fingerprint(CONFIG, "cuda", "H100", "550.54") == plain


def load(path):
    namespace = {"__name__": "my_trainers"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["make"]


def test_a_factorys_helpers_globals_and_data_files_are_in_its_identity(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "short"}\n')
    source = tmp_path / "train.py"
    source.write_text(textwrap.dedent(f"""
        LENGTH = 128

        def helper(candidate):
            return candidate

        def make(candidate):
            open({str(data)!r}).read()
            return helper(candidate), LENGTH
    """))
    first = identity(load(source))
    source.write_text(source.read_text().replace("LENGTH = 128", "LENGTH = 4096"))  # a global, not make's code
    assert identity(load(source)) != first
    second = identity(load(source))
    source.write_text(source.read_text().replace("return candidate\n", "return candidate  # bigger\n"))
    third = identity(load(source))
    assert third != second  # a helper's change
    data.write_text('{"text": "' + "long " * 1000 + '"}\n')  # the data the factory loads
    assert identity(load(source)) != third


def test_a_config_json_edited_between_two_runs_is_not_mixed_into_the_answer_or_the_report(tmp_path):
    """Issue 50, item 7: the model's config.json edited between two runs of one search. The second run measures
    again (a note says so), and its best.json and report.html show its own probes only, not both configurations'."""
    import json

    from fakes import FormulaRunner, MiB, formula_spec

    from autofit.export import write as export_write
    from autofit.report._data import gather
    from autofit.rungs import resolve_ladder
    from autofit.search import Search

    model = tmp_path / "model"
    model.mkdir()
    config = json.loads((Path(_store.__file__).parents[1] / "models" / "tiny-qwen2.json").read_text())
    (model / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"

    def run():
        report = Search(formula_spec(out, 900 * MiB, model=str(model)), FormulaRunner(900 * MiB),
                        resolve_ladder(["micro-batch"])).run()
        export_write(report, out)
        return report, json.loads((out / "best.json").read_text())

    first, first_best = run()
    again, again_best = run()  # unchanged: everything is reused, nothing probed
    assert again.probes_run == 0 and again_best["study"]["fingerprint"] == first_best["study"]["fingerprint"]
    runs_before = len(gather(out).probes)
    config["num_hidden_layers"] += 2
    (model / "config.json").write_text(json.dumps(config))
    edited, edited_best = run()
    assert edited.probes_run == first.probes_run  # measured again, on the edited configuration
    assert edited_best["study"]["fingerprint"] != first_best["study"]["fingerprint"]
    assert any("measured on another configuration of the model" in note for note in edited_best["notes"])
    shown = gather(out).probes
    assert len(shown) == edited.probes_run < runs_before + edited.probes_run  # this run's probes, not both
