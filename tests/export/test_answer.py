"""Issue 45, item 3: one answer, many renderers. The export derives the answer once per write (the candidate as
trained, its keys and comments, the trades, the engine, the changes to the user's file), and best.yaml, best.json's
answer and the terminal's summary render that one value."""

from __future__ import annotations

import json

import yaml
from fakes import FormulaRunner, MiB, spec_of

from autofit import export
from autofit.export import _answer
from autofit.rungs import resolve_ladder
from autofit.search import Search


def _report(tmp_path):
    spec = spec_of(model="tiny-qwen2", budget_bytes=350 * MiB, out_dir=tmp_path, max_length=512, device="cpu",
                   predict=False)
    return Search(spec, FormulaRunner(spec.budget_bytes), resolve_ladder(None)).run()


def test_the_answer_is_derived_once_and_every_output_renders_it(tmp_path, monkeypatch):
    report = _report(tmp_path)
    assert report.fits
    derived = []
    trained = _answer.as_trained
    monkeypatch.setattr(_answer, "as_trained", lambda *args: derived.append(args) or trained(*args))
    monkeypatch.setattr("autofit.export._write.trainable_checkpoint", lambda config, name: None)
    export.write(report, tmp_path)
    chosen = [args for args in derived if args[0] == report.chosen.candidate]
    assert len(chosen) == 1  # best.json, best.yaml and the terminal: one derivation (the user's run's: the "was")
    answer = report.answer
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["config"] == json.loads(json.dumps(answer.config, default=str))
    assert best["model_args"] == answer.model_args and best["trades"] == answer.trades
    assert best["rungs"] == list(answer.candidate.rungs)
    written = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert set(written) == set(answer.written)
    text = (tmp_path / "best.yaml").read_text()
    for key in answer.written:  # each key with the answer's comment on it
        line = next(line for line in text.splitlines() if line.startswith(f"{key}: "))
        assert line.endswith(f"# {answer.comments[key]}"), line
    summary = export.summary_lines(report)
    assert summary[0].startswith(f"best: {answer.candidate.describe()} [")
    assert summary[1] == f"wrote {tmp_path / 'best.yaml'} and {tmp_path / 'best.json'}"


def test_no_answer_where_nothing_fits(tmp_path):
    spec = spec_of(model="tiny-qwen2", budget_bytes=1 * MiB, out_dir=tmp_path, max_length=512, device="cpu",
                   predict=False)
    report = Search(spec, FormulaRunner(spec.budget_bytes), resolve_ladder(None)).run()
    assert not report.fits and export.answer(report) is None
    export.write(report, tmp_path)
    assert report.answer is None and not (tmp_path / "best.yaml").exists()
    assert json.loads((tmp_path / "best.json").read_text())["config"] is None
