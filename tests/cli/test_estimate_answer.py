"""The estimate's answer first (issue 61, item 3): the line after the header names the level to use, by the rule a
search chooses by; the table fits 120 columns unless ``--wide`` asks for every term; on a device where the memory
model is exact, the search writes the configuration the estimate's "use:" line names."""

from __future__ import annotations

import json

import pytest
from fakes import spec_of

from autofit import cli, memory_model
from autofit.core import Outcome, ProbeResult
from autofit.rungs import resolve_ladder
from autofit.search import Search

MiB = 2**20
TINY = ["--model", "tiny-qwen2", "--device", "cpu", "--effective-batch", "16", "--max-length", "256"]


def estimate_lines(capsys, *argv: str) -> list:
    assert cli.main(["estimate", *argv]) == 0
    return capsys.readouterr().out.splitlines()


class ExactDevice:
    """A device whose peak is the memory model's point prediction, every candidate as fast as the next."""

    def __init__(self, budget: int):
        self.budget = budget

    def run(self, candidate, steps, **plan):
        peak = int(max(ledger.total for ledger in memory_model.phase_ledgers(candidate)))
        if peak > self.budget:
            return ProbeResult(Outcome.OOM, peak_bytes=peak, error="fake OOM", error_phase="forward_backward")
        return ProbeResult(Outcome.OK, peak_bytes=peak, tokens_per_second=1000.0, steps=steps)


@pytest.mark.parametrize("maximize", ["batch", "length"])
@pytest.mark.parametrize("budget_mib", [60, 90, 160, 400])
def test_the_search_writes_what_the_use_line_names(tmp_path, capsys, budget_mib, maximize):
    spec = spec_of(model="tiny-qwen2", budget_bytes=budget_mib * MiB, out_dir=tmp_path, effective_batch=16,
                   max_length=256, maximize=maximize)
    result = Search(spec, ExactDevice(spec.budget_bytes), resolve_ladder(spec.ladder)).run()
    use = estimate_lines(capsys, *TINY, "--gpu-memory", f"{budget_mib}MiB", "--maximize", maximize)[1]
    if not result.fits:
        assert use.startswith("use: nothing is predicted to fit 60.00 MiB"), use
        return
    assert use.startswith("use: level "), use
    assert f", {result.chosen.candidate.describe()}: " in use, (use, result.chosen.candidate.describe())


def test_the_answer_says_why_and_the_table_fits_a_terminal(capsys):
    lines = estimate_lines(capsys, *TINY, "--gpu-memory", "90MiB")
    assert lines[1].startswith("use: level 5 (+lora) ")
    assert lines[2].startswith("  why: the first level that fits; no level that keeps the training as asked does")
    assert "levels 0-4 are over the budget" in lines[2]
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("lvl ")):]
    table = table[:next(i for i, line in enumerate(table) if not line.strip() or line.startswith("fits:"))]
    assert len(table) == 9 and max(len(line) for line in table) <= 120
    assert "weights" not in table[0] and "peak" in table[0]
    wide = estimate_lines(capsys, *TINY, "--gpu-memory", "90MiB", "--wide")
    header = next(line for line in wide if line.startswith("lvl "))
    assert all(term in header.split() for term in ("weights", "grads", "optim", "activ", "logits"))


def test_a_lighter_level_is_named_when_the_budget_is_inside_the_answers_band(capsys):
    lines = estimate_lines(capsys, *TINY, "--gpu-memory", "90MiB")
    lighter = next(line for line in lines if line.startswith("  or (lighter"))
    assert "level 7 (+quant-4bit)" in lighter and "4-bit base weights" in lighter
    assert "8-bit base weights" not in lighter  # the 4-bit level climbed the 8-bit rung; its base is not 8-bit


def test_maximize_length_answers_with_the_longest_length(capsys):
    lines = estimate_lines(capsys, *TINY, "--gpu-memory", "90MiB", "--maximize", "length")
    assert lines[1].startswith("use: level 3 (+bf16-weights), mb=1x16 len=128 ")
    assert lines[2] == "  why: the longest length predicted to fit, 128 tokens; levels 0-2 are over the budget"


def test_a_card_answers_with_the_fastest_of_the_fits_that_keep_the_training(capsys):
    """Qwen2.5-0.5B at 4096 tokens on an L4: the micro-batch and checkpointing levels both fit as asked; the answer is
    the faster predicted, as a search's timing picks between them, and its figures follow the table."""
    lines = estimate_lines(capsys, "--model", "Qwen/Qwen2.5-0.5B", "--gpu-memory", "L4", "--max-length", "4096")
    assert lines[1].startswith("use: level 2 (+micro-batch), mb=2x4 len=4096: ") and " tok/s" in lines[1]
    assert lines[2] == ("  why: the fastest predicted of the 2 levels that fit with the training as asked; "
                        "levels 0-1 are over the budget")
    figures = next(line for line in lines if line.startswith("use, level "))
    assert figures.startswith("use, level 2 (expandable-segments+micro-batch), mb=2x4 len=4096: predicts ")


def test_estimate_json_answer_is_the_use_line(capsys):
    assert cli.main(["estimate", *TINY, "--gpu-memory", "90MiB", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["estimates"][0]["answer"]
    assert answer["level"] == 5 and answer["without"] == ["optimizer-8bit"]
    assert answer["why"].startswith("the first level that fits;")
    assert [other["label"].split(",")[0] for other in answer["alternatives"]] == ["lighter"]


def test_no_fit_answers_with_the_lightest(capsys):
    lines = estimate_lines(capsys, *TINY, "--gpu-memory", "20MiB")
    assert lines[1].startswith("use: nothing is predicted to fit 20.00 MiB; the lightest level, level 7")


@pytest.mark.parametrize("available_gib, names_another", [(10, True), (1024, False)])
def test_an_offloading_answer_says_what_a_search_on_this_host_takes(capsys, monkeypatch, available_gib,
                                                                   names_another):
    """Qwen2.5-7B SFT on an H100 is answered by the optimizer's offload (130 GiB pinned); where this machine has less
    RAM, the line after the alternatives names the level a search here takes without it."""
    import autofit.search

    monkeypatch.setattr(autofit.search, "available_host_bytes", lambda: available_gib * 2**30)
    lines = estimate_lines(capsys, "--model", "Qwen/Qwen2.5-7B", "--gpu-memory", "H100")
    assert lines[1].startswith("use: level 5 (+optimizer-offload) ") and "of host RAM pinned" in lines[1]
    here = [line for line in lines if line.startswith("  on this machine (")]
    if names_another:
        assert len(here) == 1 and f"({available_gib}.00 GiB of RAM available, " in here[0]
        assert "a search leaves that offloading out and takes level 6 (+bf16-weights), " in here[0]
    else:
        assert here == []
