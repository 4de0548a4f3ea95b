"""``autofit search --json`` (issue 61, item 5): one JSON document on stdout on every way a search ends (nothing fits,
bad input, a refused command line, probes that cannot run here, an interruption, SIGTERM), carrying the exit code
and its reason as the process returns them; everything else on stderr. The exit codes are declared once
(``autofit.cli._exit``) and documented in docs/cli.md. The fitting path runs in tests/cli/test_skill.py, as the agent
skill's own commands."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autofit import cli
from autofit.cli._exit import EXITS, exit_codes_help
from autofit.cli._search_json import launch_with_best
from autofit.cli._signals import Terminated
from autofit.search import InfrastructureError

REPO = Path(__file__).resolve().parents[2]


def command(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autofit.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          check=False)


def document_of(done: subprocess.CompletedProcess) -> dict:
    document = json.loads(done.stdout)  # fails on anything beside the one document
    assert document["exit"]["code"] == done.returncode, done.stderr
    return document


@pytest.mark.parametrize("argv, words", [
    (("--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "lots"), "--gpu-memory 'lots' is not valid"),
    (("--model", "tiny-qwen2", "--no-such-flag"), "unrecognized arguments: --no-such-flag"),
    (("--model", "tiny-qwen2", "--gpu-memory", "300MiB", "--", "python", "train.py"), "cannot be read"),
], ids=["bad-value", "argparse", "bad-launch"])
def test_bad_input_is_a_document_with_the_line_of_stderr(tmp_path, argv, words):
    flags, _, launch = " ".join(argv).partition(" -- ")
    done = command("search", *flags.split(), "--json", "--out", str(tmp_path / "out"),
                   *(["--", *launch.split()] if launch else []))
    assert done.returncode == 2
    document = document_of(done)
    assert document["exit"]["reason"] == "bad_input" and document["command"] == "search"
    assert done.stderr.count("\n") == 1 and words in done.stderr
    assert done.stderr == f"autofit: error: {document['exit']['message']}\n"
    assert document["fits"] is False and document["answer"] is None and document["next"]["train"] is None
    assert not (tmp_path / "out").exists()


def test_nothing_fits_names_what_to_change_and_leaves_best_json(tmp_path):
    """The DPO case of the issue: the memory model rules every level out, nothing is probed."""
    out = tmp_path / "dpo"
    done = command("search", "--model", "tiny-qwen2", "--algo", "dpo", "--device", "cpu", "--gpu-memory", "300MiB",
                   "--out", str(out), "--json")
    assert done.returncode == 3, done.stderr
    document = document_of(done)
    assert document["exit"]["reason"] == "nothing_fits"
    assert "--max-length" in document["exit"]["message"]
    assert f"autofit: {document['exit']['message']}" in done.stderr
    lightest = document["nothing_fits"]["lightest_predicted"]
    assert lightest["peak"]["bytes"] > 300 * 2**20 and lightest["rungs"]
    assert document["files"]["best_json"] == str(out.resolve() / "best.json") and (out / "best.json").is_file()
    assert document["files"]["best_yaml"] is None and not (out / "best.yaml").exists()
    assert document["question"]["algo"] == "dpo" and document["question"]["length_field"] == "max_length"
    assert document["probes"]["this_run"] == 0 and document["next"]["resume"] is None


@pytest.mark.parametrize("raised, code, reason", [
    (InfrastructureError("probes cannot start here: the same error on two candidates"), 4, "probes_cannot_run"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (Terminated(), 143, "terminated"),
], ids=["probes-cannot-run", "ctrl-c", "sigterm"])
def test_a_search_that_stops_is_a_document_with_the_command_that_resumes_it(monkeypatch, capsys, tmp_path, raised,
                                                                             code, reason):
    import autofit._api

    def stops(*args, **kwargs):
        print("a library's print")  # under --json it goes to stderr, never into the document
        raise raised

    monkeypatch.setattr(autofit._api, "run_search", stops)
    argv = ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "300MiB", "--out",
            str(tmp_path / "o"), "--json"]
    assert cli.main(argv) == code
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["exit"]["code"] == code and document["exit"]["reason"] == reason
    assert "a library's print" in captured.err
    assert document["next"]["resume"] == "autofit " + " ".join(argv[:])
    assert document["question"]["model"] == "tiny-qwen2" and document["answer"] is None


def test_only_the_document_reaches_stdout_even_from_a_child_process():
    script = ("import os, subprocess, sys\n"
              "from autofit.cli._search_json import stdout_to_stderr\n"
              "with stdout_to_stderr():\n"
              "    print('python print')\n"
              "    subprocess.run([sys.executable, '-c', 'print(\"child print\")'], check=True)\n"
              "print('{}')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout == "{}\n"
    assert "python print" in done.stderr and "child print" in done.stderr


def test_the_users_launch_runs_best_yaml_without_the_flags_written_into_it():
    words = ["accelerate", "launch", "--config_file", "ddp.yaml", "trl", "sft", "--config", "sft.yaml",
             "--learning_rate", "1e-4", "--bf16", "--max_length=512", "--num_processes", "2"]
    line = launch_with_best(words, "/out/best.yaml", {"learning_rate": 1e-4, "bf16": True, "max_length": 512})
    assert line == "accelerate launch --config_file ddp.yaml trl sft --config /out/best.yaml --num_processes 2"
    assert launch_with_best(["accelerate", "launch", "x.py"], "/out/best.yaml", {}) is None


def test_every_exit_code_is_documented_in_the_help_and_in_docs_cli():
    page = (REPO / "docs" / "cli.md").read_text()
    table = page[page.index("| code | reason |"):]
    rows = dict(re.findall(r"^\| (\d+) \| `(\w+)`", table, flags=re.M))
    assert {entry.code: entry.reason for entry in EXITS} == {int(code): reason for code, reason in rows.items()}
    epilog = cli.build_parser()._subparsers._group_actions[0].choices["search"].epilog
    assert epilog == exit_codes_help()
    assert all(f"{entry.code:<3} {entry.reason}:" in epilog for entry in EXITS)
    assert (cli.EXIT_OK, cli.EXIT_BAD_INPUT, cli.EXIT_NO_FIT, cli.EXIT_PROBES_CANNOT_RUN) == (0, 2, 3, 4)
