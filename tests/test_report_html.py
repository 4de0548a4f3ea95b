"""What the user looks at: report.html drawn from a real search (its numbers are the study's), `autofit report DIR`,
the study's attributes as optuna-dashboard shows them, and `autofit estimate --plot`."""

import json
import re

import pytest

from autofit import cli
from autofit.core import format_size

SEARCH = ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "143MiB", "--max-length", "64",
          "--verify-steps", "3", "-q"]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """micro-batch 1x8 fits, 2x4 runs out of memory and checkpointing makes 2x4 fit (23 s on the CPU meter). Which of
    the two fits is chosen is a measured throughput, so no test here may depend on it: they read the choice from
    best.json."""
    out = tmp_path_factory.mktemp("report")
    assert cli.main(SEARCH + ["--out", str(out)]) == 0
    return out, json.loads((out / "best.json").read_text())


def study_trials(out):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(out / "study.journal")))  # by path, as optuna-dashboard opens it
    (summary,) = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage).get_trials()


@pytest.mark.slow
def test_the_report_shows_the_answer_and_the_studys_numbers(searched):
    out, best = searched
    page = (out / "report.html").read_text()
    verify = [record for record in best["candidates"] if record["kind"] == "verify"][-1]
    assert best["rungs"] == verify["rungs"] and best["rungs"] in (["micro-batch"], ["micro-batch", "checkpointing"])
    assert f"Best: <b>{verify['candidate']}</b> [{', '.join(best['rungs'])}]" in page
    assert f"verified peak <b>{format_size(best['verified']['peak_bytes'])}</b> of 143.00 MiB" in page
    for trade in best["trades"]:  # what each rung cost, in the words best.json uses
        assert trade.replace("'", "&#x27;") in page
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\w+)</td><td>([^<]*)</td><td>([^<]*)</td><td class='(\w+)'>\w+</td>"
                      r"<td class='num'>([^<]*)</td>", page)
    assert [(kind, rungs, candidate, outcome, peak) for _, kind, rungs, candidate, outcome, peak in rows] == [
        (r["kind"], "+".join(r["rungs"]), r["candidate"], r["outcome"], format_size(r["peak_bytes"]))
        for r in best["candidates"]]
    assert any(outcome == "OOM" for *_, outcome, _ in rows)
    # four figures: peak per level (with the model's curves), phases, ledger, throughput; their text is text
    assert page.count("<svg") == 4
    assert ("budget 143.00 MiB" in page and "1: micro-batch (OOM)" in page
            and "2: micro-batch+checkpointing (OK)" in page)
    for phase in best["verified"]["phase_peaks"]:
        assert f">{phase}<" in page
    assert "Predicted peak by term" in page and "optimizer states" in page
    assert f"chosen: {verify['candidate']}" in page  # marked among the fits on the throughput figure
    assert f"optuna-dashboard {out / 'study.journal'}" in page
    assert not re.search(r"(src|href)=['\"]?https?:", page)  # self-contained: nothing fetched from the network


@pytest.mark.slow
def test_autofit_report_draws_the_same_page_again(searched, capsys):
    out, _ = searched
    first = (out / "report.html").read_text()
    (out / "report.html").unlink()
    assert cli.main(["report", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out / 'report.html'}"
    assert (out / "report.html").read_text() == first


@pytest.mark.slow
def test_the_study_opens_by_path_with_each_probes_attributes(searched):
    out, best = searched
    trials = study_trials(out)
    assert [t.user_attrs["config"] for t in trials] == [r["candidate"] for r in best["candidates"]]
    for trial, record in zip(trials, best["candidates"], strict=True):
        attrs = trial.user_attrs
        assert attrs["outcome"] == record["outcome"] and attrs["peak_bytes"] == record["peak_bytes"]
        assert attrs["rungs"] == ("+".join(record["rungs"]) or "baseline")
        assert attrs["tokens_per_second"] == pytest.approx(record["tokens_per_second"], abs=0.1)
        assert attrs["phase_peaks"] and max(attrs["phase_peaks"].values()) == record["peak_bytes"]
        over = trial.constraints[0] if isinstance(trial.constraints, list) else trial.constraints["peak_minus_budget"]
        assert (over > 0) == (record["outcome"] == "OOM")


@pytest.mark.slow
def test_the_model_curve_passes_through_what_it_was_calibrated_on(searched):
    from autofit.report import gather

    out, best = searched
    data = gather(out)
    verify = [r for r in best["candidates"] if r["kind"] == "verify"][-1]
    chosen = next(p for p in data.probes if p.kind == "verify")
    curve = dict(data.curves[chosen.level])
    assert sorted(curve) == [1, 2, 4, 8]  # every micro-batch that divides the effective batch
    assert curve[chosen.candidate.micro_batch] == pytest.approx(verify["predicted_bytes"], rel=1e-6)
    assert sum(data.ledger.values()) == pytest.approx(verify["predicted_bytes"], rel=1e-6)


def test_report_of_a_folder_without_a_search_is_one_line_exit_2(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "best.json does not exist" in err and str(tmp_path) in err


def test_estimate_draws_every_level_against_the_budget(tmp_path, capsys):
    path = tmp_path / "ledger.svg"
    assert cli.main(["estimate", "--model", "Qwen/Qwen2.5-7B", "--algo", "grpo", "--gpu-memory", "24GB",
                     "--plot", str(path)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"plot: {path}")
    drawing = path.read_text()
    assert "0: baseline (8x1, len 512)" in drawing and "+quant-4bit" in drawing and "budget 22.35 GiB" in drawing
    assert "optimizer states" in drawing and "activations" in drawing


@pytest.mark.parametrize("name, message", [("ledger.txt", "must end in .svg, .png, .pdf"),
                                           ("missing/ledger.svg", "does not exist")])
def test_estimate_plot_refuses_a_path_it_cannot_write(tmp_path, capsys, name, message):
    assert cli.main(["estimate", "--model", "Qwen/Qwen2.5-7B", "--gpu-memory", "24GB",
                     "--plot", str(tmp_path / name)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_a_report_that_cannot_be_drawn_leaves_the_answer_standing(tmp_path, monkeypatch, caplog):
    from autofit import _api as api
    from autofit import report as report_html

    def broken(out_dir):
        raise RuntimeError("no renderer")

    monkeypatch.setattr(report_html, "write", broken)
    with caplog.at_level("WARNING", logger="autofit"):
        assert api.write_report(tmp_path) is None
    assert f"report.html was not written (RuntimeError: no renderer); `autofit report {tmp_path}`" in caplog.text


def test_report_of_a_damaged_study_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "best.json").write_text(json.dumps({"candidates": [], "model": "tiny-qwen2", "algo": "sft"}))
    (tmp_path / "study.journal").write_text("{not json\n")
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "study.journal holds no study (empty, or damaged)" in err
