"""The output contract, held by every rendering of the answer (autofit.export.OUTPUTS: best.json, best.yaml, the
terminal's summary): each renders the one answer the export derived, the same text for the same answer, every key
of the answer where it writes keys, and nothing but best.json where nothing fits (an earlier answer would mislead)."""

from __future__ import annotations

import json

import pytest
import yaml
from fakes import FormulaRunner, MiB, spec_of

from autofit import export
from autofit.rungs import resolve_ladder
from autofit.search import Search

READERS = {"best.json": json.loads, "best.yaml": yaml.safe_load, "": str}


def _report(tmp_path, budget_mib):
    spec = spec_of(model="tiny-qwen2", budget_bytes=budget_mib * MiB, out_dir=tmp_path, max_length=512,
                   device="cpu", predict=False)
    return Search(spec, FormulaRunner(spec.budget_bytes), resolve_ladder(None)).run()


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    report = _report(tmp_path_factory.mktemp("fit"), 350)
    assert report.fits
    return report, export.answer(report)


@pytest.fixture(params=[output.name for output in export.OUTPUTS], ids=lambda name: name or "terminal")
def output(request):
    return next(o for o in export.OUTPUTS if o.name == request.param)


def test_each_output_has_a_reader_here(output):
    assert output.name in READERS  # a new output gets its reader in this contract


def test_it_renders_the_answer_the_same_way_twice(output, fitted):
    report, answer = fitted
    text = output.render(report, answer)
    assert isinstance(text, str) and text.strip() and text == output.render(report, answer)
    read = READERS[output.name](text)
    if output.name == "best.json":
        assert read["model_args"] == answer.model_args and read["trades"] == answer.trades
    elif output.name == "best.yaml":
        assert set(read) == set(answer.written)
    else:
        assert answer.candidate.describe() in read


def test_where_nothing_fits_only_best_json_says_so(output, tmp_path):
    report = _report(tmp_path, 1)
    assert not report.fits and export.answer(report) is None
    text = output.render(report, None)
    if output.name == "best.json":
        assert json.loads(text)["fits"] is False
    else:
        assert text is None
