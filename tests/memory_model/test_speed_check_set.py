"""The speed model's check set holds (issue 60, item 5): every row names its source and the date the set was fixed,
its figure converts as it says, its launch file exists, and no row is one the model is calibrated against (the rows
of ``benchmarks/speed_public.py`` and ``benchmarks/speed_terms.py``, compared by model, card, batch, length and
method). Nothing here runs an estimate: ``make bench-speed-check QUICK=1`` runs two rows through the CLI."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from benchmarks import speed_check, speed_public, speed_terms

REPO = Path(__file__).resolve().parents[2]


def _method(config: dict) -> str:
    if not config.get("use_peft"):
        return "full"
    return "qlora" if config.get("load_in_4bit") or config.get("load_in_8bit") else "lora"


def _width(model: str) -> tuple:
    """A model by its shape (its configuration's widths), so that a renamed copy of a calibration model is caught."""
    path = REPO / model / "config.json" if (REPO / model).is_dir() else (
        REPO / "autofit" / "models" / (model.replace("/", "--") + ".json"))
    config = json.loads(path.read_text())
    return tuple(config.get(name) for name in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                                "num_attention_heads", "vocab_size"))


def _calibration_keys() -> set:
    keys = set()
    rows = list(speed_public.ROWS) + list(speed_public.H100_ROWS)
    rows += [row for pair in speed_terms.PAIRS for row in (pair.before, pair.after)]
    for row in rows:
        config = yaml.safe_load((REPO / row.folder / row.config).read_text())
        model = row.model or config["model_name_or_path"]
        if not (REPO / model).is_dir() and not (REPO / "autofit" / "models" /
                                                 (model.replace("/", "--") + ".json")).is_file():
            continue  # a model the estimate resolves by its own name (not a shape this set could repeat unseen)
        batch = row.batch or config.get("per_device_train_batch_size", 8)  # per GPU, as the launch gives it
        keys.add((_width(model), row.card, row.gpus, batch, config.get("max_length"), _method(config)))
    return keys


def test_every_row_has_its_source_date_and_a_figure_that_converts():
    rows = speed_check.load()
    assert 8 <= len(rows) <= 15
    assert len({row.key for row in rows}) == len(rows)
    for row in rows:
        assert row.source.startswith("https://github.com/") and "/blob/" in row.source, row.key
        assert row.date_fixed == speed_check.FIXED == "2026-12-02", row.key
        assert (REPO / speed_check.FOLDER / row.config).is_file(), row.key
        assert (REPO / row.model / "config.json").is_file(), row.key
        config = yaml.safe_load((REPO / speed_check.FOLDER / row.config).read_text())
        assert _method(config) == row.method, row.key
        assert config["per_device_train_batch_size"] == row.micro_batch, row.key
        assert config["gradient_accumulation_steps"] == row.accumulation, row.key
        assert row.tokens_per_second_per_gpu == pytest.approx(row.micro_batch * row.accumulation * row.length
                                                               / row.measured, abs=0.5), row.key


def test_no_row_of_the_check_set_is_in_the_calibration_set():
    calibration = _calibration_keys()
    assert calibration  # the comparison reads the calibration's files
    for row in speed_check.load():
        key = (_width(row.model), row.gpu, row.gpus, row.micro_batch, row.length, row.method)
        assert key not in calibration, row.key
    calibration_sources = {speed_public.SOURCE, speed_public.H100_SOURCE, speed_terms.SOURCE, speed_terms.TORCHAO}
    for row in speed_check.load():
        assert not any(row.source.split("/blob/")[0] in source for source in calibration_sources), row.key


def test_every_pair_differs_by_its_method_alone():
    rows = {row.key: row for row in speed_check.load()}
    for what, before, after in speed_check.PAIRS:
        first, second = rows[before], rows[after]
        assert (first.model, first.gpu, first.micro_batch, first.accumulation, first.length) == (
            second.model, second.gpu, second.micro_batch, second.accumulation, second.length), what
        assert first.method != second.method and (first.gpus == second.gpus or "GPUs" in what), what


def test_a_row_parses_and_its_command_is_the_users(tmp_path):
    record = next(csv.DictReader((REPO / speed_check.FOLDER / "rows.csv").open(newline="")))
    row = speed_check.parse(record)
    command = speed_check.command(row)
    assert command[:4] == ("autofit", "estimate", "--config", f"{speed_check.FOLDER}/{row.config}")
    assert command[-1] == "--json" and ("--max-length", str(row.length)) == command[-3:-1]
    broken = dict(record, tokens_per_second_per_gpu=str(row.tokens_per_second_per_gpu * 2))
    with pytest.raises(ValueError, match="tokens/s"):
        speed_check.parse(broken)
    with pytest.raises(ValueError, match="missing"):
        speed_check.parse({key: value for key, value in record.items() if key != "source"})


def test_the_figure_before_any_change_is_kept():
    before = json.loads((REPO / speed_check.FOLDER / "before.json").read_text())
    assert before["fixed"] == speed_check.FIXED
    assert set(before["rows"]) == {row.key for row in speed_check.load()}
    assert before["pair_count"] == len(speed_check.PAIRS)
    assert "calibration" in before and before["mean_abs_error"] > 0
