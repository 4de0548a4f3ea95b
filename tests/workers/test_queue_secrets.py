"""A queue URL's password is never shown (issue 57): not in a message of the search or the worker, in any URL form
(userinfo, a query parameter, a DSN), not in best.json or search.lock; and it can come from the environment or a
file instead of the command line, which every user of the node can read. End to end against real servers, with
the password in the environment and in the URL: tests/services_lane."""

from __future__ import annotations

import json
import sys

import pytest

from autofit.core import SearchOptions, masked
from autofit.machine import exclusive
from autofit.machine._outdir import masked_argv
from autofit.workers import PASSWORD_ENV, PASSWORD_FILE_ENV
from autofit.workers._storage import with_password

PW = "s3cr3t-Pw"


@pytest.mark.parametrize("text, shown", [
    (f"redis://:{PW}@h:6379/0", "redis://:***@h:6379/0"),
    (f"redis://{PW}@h", "redis://***@h"),
    (f"rediss://default:{PW}@h:6380", "rediss://default:***@h:6380"),
    (f"postgresql+psycopg://u:{PW}@h/db", "postgresql+psycopg://u:***@h/db"),
    (f"postgresql://h/db?sslmode=require&password={PW}", "postgresql://h/db?sslmode=require&password=***"),
    (f"unix:///run/redis.sock?db=0&password={PW}", "unix:///run/redis.sock?db=0&password=***"),
    (f"mysql://u:{PW}/with?odd#chars@h/db", "mysql://u:***@h/db"),
    (f"--worker-queue=redis://:{PW}@h", "--worker-queue=redis://:***@h"),
    (f"host=h user=u password={PW} dbname=d", "host=h user=u password=*** dbname=d"),
    (f"postgresql://127.0.0.1:1/db?user=admin@myserver&password={PW}",  # an "@" in the query before the password
     "postgresql://127.0.0.1:1/db?user=admin@myserver&password=***"),
    (f" redis://{PW}@127.0.0.1:1", " redis://***@127.0.0.1:1"),  # pasted with a space: not Redis' scheme to the eye
    (f"postgresql://u:{PW}@h/db?application_name=a@b", "postgresql://u:***@h/db?application_name=a@b"),
    (f"redis://h/0?password={PW}#x@y", "redis://h/0?password=***#x@y"),
    (f"redis://:{PW}@[::1]:9/0", "redis://:***@[::1]:9/0"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),  # a user name alone is no secret for a database
    ("/shared/queue", "/shared/queue"),
])
def test_every_url_form_is_masked(text, shown):
    assert masked(text) == shown


@pytest.mark.parametrize("argv", [
    ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--worker-queue",
     f"redis://:{PW}@127.0.0.1:9/0", "--out", "OUT"],
    ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--workers", "2",
     "--worker-queue", f"redis://:{PW}@127.0.0.1:9/0", "--out", "OUT"],
    ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--workers", "2",
     "--worker-queue", f"redis://127.0.0.1:9/0?password={PW}", "--out", "OUT"],
    ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--workers", "2",
     "--worker-queue", f"postgresql://u:{PW}@127.0.0.1:9/db", "--out", "OUT"],
    ["worker", "--study", f"redis://:{PW}@127.0.0.1:9"],
    ["worker", "--study", f"postgresql://127.0.0.1:9/db?password={PW}"],
    ["worker", "--study", f"ftp://u:{PW}@host/q"],
    ["worker", "--study", ""],
])
def test_no_message_shows_the_password(argv, tmp_path, capsys):
    from autofit.cli import main

    argv = [str(tmp_path / word) if word == "OUT" else word for word in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autofit: error: ") and "\n" not in err and PW not in err, err
    assert "***" in err or "''" in err or "worker-queue" not in " ".join(argv), err


def test_a_password_that_is_not_utf8_is_one_line(monkeypatch):
    from autofit.core import InputError

    monkeypatch.setenv(PASSWORD_ENV, "pw\udcff")  # the bytes b"pw\xff", as Python holds them
    with pytest.raises(InputError, match=f"{PASSWORD_ENV} holds bytes that are not UTF-8 text"):
        with_password("redis://h", "redis")


def test_the_password_from_the_environment_is_not_shown_either(monkeypatch, capsys):
    from autofit.cli import main

    monkeypatch.setenv(PASSWORD_ENV, PW)
    assert main(["worker", "--study", "redis://127.0.0.1:9/0"]) == 2
    err = capsys.readouterr().err
    assert "cannot be reached" in err and PW not in err


def test_the_password_comes_from_the_environment_or_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv(PASSWORD_ENV, "p/w@x")
    assert with_password("redis://h:6379/0", "redis") == "redis://:p%2Fw%40x@h:6379/0"
    assert with_password("postgresql://u@h/db", "postgresql") == "postgresql://u:p%2Fw%40x@h/db"
    assert with_password("postgresql://u:own@h/db", "postgresql") == "postgresql://u:own@h/db"  # the URL's wins
    assert with_password("unix:///s.sock?db=0", "unix") == "unix:///s.sock?db=0&password=p%2Fw%40x"
    monkeypatch.delenv(PASSWORD_ENV)
    secret = tmp_path / "pw"
    secret.write_text(PW + "\n")
    secret.chmod(0o600)
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(secret))
    assert with_password("redis://h", "redis") == f"redis://:{PW}@h"
    secret.chmod(0o644)
    from autofit.core import InputError

    with pytest.raises(InputError, match="can be read by others: chmod 600 it"):
        with_password("redis://h", "redis")


def test_best_json_and_the_lock_keep_no_password(tmp_path, monkeypatch):
    options = SearchOptions(model="tiny-qwen2", device="cpu", gpu_memory="300MiB", workers=2,
                            worker_queue=f"redis://:{PW}@h:6379/0", out_dir=tmp_path / "out")
    assert options.record()["worker_queue"] == "redis://:***@h:6379/0"
    monkeypatch.setattr(sys, "argv", ["autofit", "search", "--worker-queue", f"postgresql://u:{PW}@h/db",
                                      f"--worker-queue=redis://:{PW}@h"])
    with exclusive(tmp_path / "out"):
        held = (tmp_path / "out" / "search.lock").read_text()
    assert PW not in held and json.loads(held)["argv"][3] == "postgresql://u:***@h/db"
    assert masked_argv(["a", f"redis://:{PW}@h"]) == ["a", "redis://:***@h"]
