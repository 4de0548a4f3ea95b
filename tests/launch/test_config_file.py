"""The config file as hostile input (issue 35, items 2, 7, 8): autofit reads ``--config`` once, in the search's
process, with limits (a regular file or a pipe's content, its size, its YAML aliases, no key twice), and hands that
text to TRL's parser and to the export. Each refusal is one line, exit 2, naming the file and the limit."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autofit import cli
from autofit.launch import _config_file

SFT = """\
# my SFT run
model_name_or_path: tiny-qwen2
per_device_train_batch_size: 8   # one GPU
max_length: 128
"""
ESTIMATE = ["estimate", "--device", "cpu", "--gpu-memory", "1GiB", "--config"]


def refused(capsys, path, *extra: str) -> str:
    code = cli.main([*ESTIMATE, str(path), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"autofit: error: --config {path}: "), err
    return err


def alias_bomb(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        name, previous = chr(ord("a") + level), chr(ord("a") + level - 1)
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_at_once_naming_the_limit(tmp_path, capsys):
    """A few hundred bytes of aliases ran TRL's parser for minutes and gigabytes before a MemoryError."""
    path = tmp_path / "bomb.yaml"
    path.write_text(SFT + alias_bomb())
    assert path.stat().st_size < 700
    started = time.monotonic()
    err = refused(capsys, path)
    assert time.monotonic() - started < 30
    assert "aliases expand to" in err and f"{_config_file.MAX_VALUES:,}" in err


def test_a_recursive_alias_is_refused(tmp_path, capsys):
    path = tmp_path / "loop.yaml"
    path.write_text(SFT + "loop: &x [1, *x]\n")
    assert "recursive alias" in refused(capsys, path)


def test_a_few_aliases_are_a_users_own_and_read(tmp_path, capsys):
    path = tmp_path / "anchors.yaml"
    path.write_text(SFT + "eval_steps: &n 10\nsave_steps: *n\n")
    assert cli.main([*ESTIMATE, str(path)]) == 0


def test_a_file_larger_than_the_limit_is_refused_before_anything_parses_it(tmp_path, capsys):
    """A 20 MB config made writing best.yaml run for minutes, and its resume took 395 s."""
    path = tmp_path / "huge.yaml"
    path.write_text(SFT + "# padding\n" * (_config_file.MAX_BYTES // 10 + 1))
    err = refused(capsys, path)
    assert f"larger than {_config_file.MAX_BYTES // 1024} KiB" in err


def test_a_device_or_a_folder_is_refused(capsys, tmp_path):
    assert "it is a character device, not a regular file or a pipe" in refused(capsys, "/dev/zero")
    assert "it is a directory" in refused(capsys, tmp_path)


def test_a_fifo_with_no_writer_does_not_hang(tmp_path, capsys, monkeypatch):
    """A fifo nobody writes to as --config hung the search forever (TRL's parser waited for a writer)."""
    monkeypatch.setattr(_config_file, "PIPE_WAIT_S", 1.0)
    path = tmp_path / "fifo"
    os.mkfifo(path)
    started = time.monotonic()
    err = refused(capsys, path)
    assert time.monotonic() - started < 20 and "fifo with no writer" in err


def test_a_fifo_written_later_is_read(tmp_path, capsys):
    path = tmp_path / "fifo"
    os.mkfifo(path)

    def write() -> None:
        time.sleep(0.5)
        path.write_text(SFT)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert cli.main([*ESTIMATE, str(path)]) == 0
    finally:
        writer.join()
    assert f"your run ({path} as written): mb=8x1 len=128" in capsys.readouterr().out


def test_a_pipe_is_read_once_and_its_content_handed_on(capsys):
    """``--config <(cat sft.yaml)`` is a /dev/fd path: TRL's parser, in a process of its own, could not open it
    (FileNotFoundError), and a second read of a pipe finds it empty."""
    read, write = os.pipe()
    try:
        os.write(write, SFT.encode())
        os.close(write)
        path = f"/dev/fd/{read}"
        assert cli.main([*ESTIMATE, path]) == 0
    finally:
        os.close(read)
    assert f"your run ({path} as written): mb=8x1 len=128 ckpt" in capsys.readouterr().out


@pytest.mark.slow
def test_a_search_from_a_process_substitution_writes_the_file_back(tmp_path):
    """The user's own words, in bash: ``autofit search --config <(cat sft.yaml)``; best.yaml is that content (its rows
    shortened to 32 tokens: the probes' cost, not the pipe's)."""
    (tmp_path / "sft.yaml").write_text(SFT.replace("max_length: 128", "max_length: 32"))
    out = tmp_path / "out"
    command = (f"exec {sys.executable} -m autofit.cli search --config <(cat sft.yaml) --device cpu --gpu-memory 1GiB "
               f"--verify-steps 3 --out {out} -q")
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    text = (out / "best.yaml").read_text()
    for line in ("# my SFT run", "per_device_train_batch_size: 8   # one GPU", "max_length: 32"):
        assert line in text  # the user's file, from the pipe's content (a CPU search adds use_cpu, bf16...)


def test_a_key_written_twice_is_refused_before_any_probe(tmp_path, capsys, monkeypatch):
    """Every probe ran, then ruamel's DuplicateKeyError while writing best.yaml: exit 1, nothing written."""
    from autofit import _api as api

    path = tmp_path / "twice.yaml"
    path.write_text(SFT + "learning_rate: 1.0e-5\nper_device_train_batch_size: 4\n")
    monkeypatch.setattr(api, "run_search", lambda *a, **k: pytest.fail("a probe ran"))
    code = cli.main(["search", "--config", str(path), "--device", "cpu", "--gpu-memory", "1GiB", "--out",
                     str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"autofit: error: --config {path}: the key per_device_train_batch_size is written twice")
    assert not (tmp_path / "out" / "best.yaml").exists()


def test_a_nested_key_written_twice_is_refused_and_a_merge_key_overridden_is_not(tmp_path, capsys):
    nested = tmp_path / "nested.yaml"
    nested.write_text(SFT + "model_init_kwargs:\n  dtype: bfloat16\n  dtype: float32\n")
    assert "the key dtype is written twice" in refused(capsys, nested)
    merged = tmp_path / "merged.yaml"
    merged.write_text(SFT + "base: &b {dtype: bfloat16}\nmodel_init_kwargs:\n  <<: *b\n  dtype: float32\n")
    code = cli.main([*ESTIMATE, str(merged)])
    err = capsys.readouterr().err  # the merge is the user's; TRL itself refuses the unknown 'base' key
    assert "written twice" not in err and (code == 0 or "Unknown arguments" in err)


def test_the_parser_child_never_opens_the_users_path(tmp_path):
    """TRL's parser reads the text it is given on its standard input (a private copy), and its messages name the
    user's path."""
    from autofit.core import InputError
    from autofit.launch._trl_file import _parse

    missing = str(tmp_path / "gone.yaml")
    user = _parse(missing, "sft", SFT)
    assert user.training["per_device_train_batch_size"] == 8 and user.path == missing
    with pytest.raises(InputError, match="gone.yaml must contain a YAML mapping"):
        _parse(missing, "sft", "- a list\n")
    assert not Path(missing).exists()


def test_a_file_the_writer_of_best_yaml_cannot_read_is_refused_before_any_probe(tmp_path, capsys):
    """Two merge keys in one mapping: TRL's parser (PyYAML) reads it, ruamel.yaml, which writes best.yaml back as the
    user's file, refuses it (DuplicateKeyError after every probe had run)."""
    path = tmp_path / "merges.yaml"
    path.write_text(SFT + "a: &a {dtype: bfloat16}\nb: &b {device_map: auto}\nmodel_init_kwargs:\n  <<: *a\n  <<: *b\n")
    err = refused(capsys, path)
    assert "ruamel.yaml, which writes best.yaml back" in err and 'duplicate merge key "<<"' in err
