"""Issue 50, item 1: a stored calibration is input. ``autofit estimate --from DIR`` reads best.json's memory and
throughput models back; a scale of -1 predicted negative peaks that all "fit", NaN or a zero bandwidth crashed. Each
bad figure is now one line naming the key and the file, exit 2; the good file still calibrates."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from autofit import cli
from autofit.memory_model import Calibration, ModelShape, SpeedCalibration, card_named

ARGV = ["estimate", "--model", "tiny-qwen2", "--gpu-memory", "H100", "--max-length", "64"]


def _stored() -> dict:
    where = dict(model="tiny-qwen2", algo="sft", device="cuda")
    memory = Calibration(static_scale=1.1, dynamic_scale=0.9, method="two-term", points=2,
                         shape=ModelShape.from_model("tiny-qwen2"), **where)
    speed = SpeedCalibration(compute_scale=1.2, fixed_scale=1.0, method="scale", points=1,
                             card=asdict(card_named("H100")), **where)
    return {"memory_model": memory.to_dict(), "speed_model": speed.to_dict()}


def _estimate(tmp_path, capsys, best: dict):
    (tmp_path / "best.json").write_text(json.dumps(best))
    code = cli.main([*ARGV, "--from", str(tmp_path)])
    return code, capsys.readouterr()


def test_a_good_stored_model_still_calibrates(tmp_path, capsys):
    code, out = _estimate(tmp_path, capsys, _stored())
    assert code == 0, out.err
    assert "calibrated on 2 probe(s)" in out.out and "tok/s calibrated on 1 timed probe(s)" in out.out


@pytest.mark.parametrize("part,key,value", [
    ("memory_model", "static_scale", -1), ("memory_model", "dynamic_scale", 0),
    ("memory_model", "static_scale", float("nan")), ("memory_model", "dynamic_scale", float("inf")),
    ("memory_model", "points", -3), ("memory_model", "max_residual", "big"), ("memory_model", "method", "magic"),
    ("speed_model", "compute_scale", -0.5), ("speed_model", "fixed_scale", float("nan")),
    ("speed_model.card", "bandwidth", 0), ("speed_model.card", "flops", -80e9),
    ("memory_model.shape", "hidden", 0), ("memory_model.shape", "layers", 2.5),
    ("memory_model.shape", "tied_embeddings", "yes"),
    # a held-out hostile round: finite but absurd scales overflowed to NaN peaks (a traceback)
    ("memory_model", "static_scale", 1e308), ("memory_model", "max_residual", 1e300),
    ("speed_model", "compute_scale", 1e300),
])
def test_a_bad_stored_figure_is_one_line_naming_the_key_and_the_file(tmp_path, capsys, part, key, value):
    best = _stored()
    target = best
    for name in part.split("."):
        target = target[name]
    target[key] = value
    code, out = _estimate(tmp_path, capsys, best)
    assert code == 2, out.out[-500:]
    assert out.err.startswith("autofit: error: --from ") and out.err.count("\n") == 1, out.err
    named = f"{part.replace('memory_model.', '')}.{key}"
    assert str(tmp_path / "best.json") in out.err and named in out.err, out.err
    assert "Traceback" not in out.err and out.out == ""


def test_a_best_json_nested_beyond_reading_is_named_as_the_file(tmp_path, capsys):
    """It was blamed on the model's config.json (a RecursionError caught as the model's)."""
    (tmp_path / "best.json").write_text('{"memory_model": ' + "[" * 200_000 + "]" * 200_000 + "}")
    code = cli.main([*ARGV, "--from", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"autofit: error: --from {tmp_path / 'best.json'} cannot be read"), err
    assert "config.json" not in err and err.count("\n") == 1
