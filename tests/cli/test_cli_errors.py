"""``autofit search`` on bad input: exit code 2 and one line on stderr that names the bad value, before any probe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autofit import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_probes(monkeypatch, tmp_path):
    """Bad input must fail before any probe process or search starts."""

    class NoRunner:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a probe runner was created for bad input")

    def no_search(*args, **kwargs):
        raise AssertionError("the search started for bad input")

    import autofit._api

    monkeypatch.setattr(autofit._api, "ProcessRunner", NoRunner)
    monkeypatch.setattr(autofit._api, "Search", no_search)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # an unknown model is not found in a real cache


def exit_code(argv):
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse's own errors exit
        return exc.code


def base_args(tmp_path, **overrides):
    args = {"--model": "tiny-qwen2", "--device": "cpu", "--gpu-memory": "1GiB", "--max-length": "64",
            "--out": str(tmp_path / "out")}
    args.update(overrides)
    argv = ["search"]
    for flag, value in args.items():
        if value is not None:
            argv += [flag, value]
    return argv


@pytest.mark.parametrize("overrides, named", [
    ({"--model": "nobody/no-such-model-xyz"}, "nobody/no-such-model-xyz"),
    ({"--algo": "dpo-nope"}, "dpo-nope"),
    ({"--gpu-memory": "12XB"}, "12XB"),
    ({"--min-length": "128", "--max-length": "64"}, "128"),
    ({"--ladder": "micro-batch,warp-drive"}, "warp-drive"),
    ({"--device": "gpu"}, "gpu"),
    ({"--maximize": "speed"}, "speed"),
    ({"--effective-batch": "0"}, "'0'"),
    ({"--gpu-memory": None}, "--gpu-memory"),
    ({"--max-length": "-3"}, "'-3'"),
    ({"--ladder": ","}, "','"),
    ({"--effective-batch": "1000000000"}, "65,536"),  # absurd sizes are refused, not built row by row
    ({"--max-length": "1000000000"}, "2,147,483,648"),
    ({"--max-length": "100000"}, "max_position_embeddings"),
    ({"--probe-steps": "100000"}, "at most 1000"),  # issue 50, item 4: it had no bound, and fits came back as OOM
    ({"--verify-steps": "100000"}, "from 1 to 1000"),
    # issue 50, item 4: bytes the command line could not decode (kept as lone surrogates) were a UnicodeEncodeError
    ({"--model": "/tmp/m\udcff"}, "holds bytes that are not UTF-8"),
    ({"--out": "out-\udcfe"}, "holds bytes that are not UTF-8"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, overrides, named):
    code = exit_code(base_args(tmp_path, **overrides))
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == cli.EXIT_BAD_INPUT == 2
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("autofit: error:")
    assert named in lines[0]
    assert not (tmp_path / "out" / "best.json").exists()


def test_min_length_error_names_both_lengths(tmp_path, capsys):
    assert exit_code(base_args(tmp_path, **{"--min-length": "128", "--max-length": "64"})) == 2
    err = capsys.readouterr().err
    assert "128" in err and "64" in err


def test_missing_model_is_a_usage_error(tmp_path, capsys):
    assert exit_code(base_args(tmp_path, **{"--model": None})) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--model" in lines[0]


def test_search_help_lists_options():
    done = subprocess.run(
        [sys.executable, "-m", "autofit.cli", "search", "--help"], cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for option in ("--maximize", "--ladder", "--gpu-memory", "--min-length", "--effective-batch"):
        assert option in done.stdout


@pytest.mark.parametrize("argv", [["bogus"], []])
def test_top_level_usage_error_hint(capsys, argv):
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "autofit autofit" not in err and "see autofit --help" in err


@pytest.mark.parametrize("timeout", ["0", "-1"])
def test_non_positive_probe_timeout_is_bad_input(tmp_path, capsys, timeout):
    assert exit_code(base_args(tmp_path, **{"--probe-timeout": timeout})) == 2
    assert timeout in capsys.readouterr().err


def test_a_configuration_no_device_could_hold_is_refused(tmp_path, capsys):
    import json

    from autofit.machine._registry import BUNDLED_DIR

    config = json.loads((BUNDLED_DIR / "tiny-qwen2.json").read_text())
    config["num_hidden_layers"] = 10**9
    (tmp_path / "huge").mkdir()
    (tmp_path / "huge" / "config.json").write_text(json.dumps(config))
    code = exit_code(base_args(tmp_path, **{"--model": str(tmp_path / "huge"), "--gpu-memory": "99999TiB"})
                     + ["--no-predict"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "parameters" in err


def test_estimate_refuses_absurd_sizes_at_once(capsys):
    code = exit_code(["estimate", "--model", "Qwen/Qwen2.5-7B", "--gpu-memory", "80GB", "--effective-batch",
                      "1000000000"])
    assert code == 2 and "65,536" in capsys.readouterr().err


def test_a_fifo_where_the_study_goes_is_refused_not_waited_on(tmp_path):
    """Issue 50, item 4: a fifo named study.journal in --out hung the search (appending to a fifo waits for a
    reader)."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "study.journal")
    done = subprocess.run([sys.executable, "-m", "autofit.cli", *base_args(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{out / 'study.journal'} is not a file (a fifo)" in done.stderr and "Traceback" not in done.stderr


def test_a_cache_that_cannot_be_created_is_one_line(tmp_path):
    """Issue 50, item 4: HOME unwritable (here: a folder no file can be made in) and no cache set was a traceback."""
    env = {key: value for key, value in os.environ.items() if key not in ("AUTOFIT_CACHE", "XDG_CACHE_HOME")}
    env["HOME"] = "/proc/self"
    done = subprocess.run([sys.executable, "-m", "autofit.cli", *base_args(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.endswith("autofit: error: the cache folder /proc/self/.cache/autofit cannot be created (No "
                                "such file or directory): set AUTOFIT_CACHE to a folder you can write\n")
    assert "Traceback" not in done.stderr
