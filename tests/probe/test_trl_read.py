"""TRL's parser of a ``--config`` file runs in a process forked from the probe server
(``autofit.probe.read_trl_config``: TRL's config imports are paid once, not for every file), and what it hands back is
what the command ``python -m autofit.probe._trl_config`` prints in a fresh interpreter; where the server cannot fork
it, that command runs."""

import json
import os
import subprocess
import sys

import pytest

from autofit.probe import _trl_read

FILE = "model_name_or_path: tiny-qwen2\nper_device_train_batch_size: 4\nmax_length: 64\nlearning_rate: 3.0e-5\n"
REFUSED = "per_device_train_batch_size: abc\n"
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRANSFORMERS_VERBOSITY": "error"}


def command(path, text, *flags):
    """The command in a fresh interpreter, as the search ran it before the server did."""
    return subprocess.run([sys.executable, "-m", "autofit.probe._trl_config", "sft", path, *flags], env=ENV,
                          input=text, capture_output=True, text=True, timeout=300)


def test_the_servers_child_reads_a_file_as_the_command_does(tmp_path):
    path = str(tmp_path / "sft.yaml")
    for text, flags in ((FILE, ("--max_length", "32")), (REFUSED, ())):
        forked = _trl_read._forked(["x"], ["sft", path, *flags], text, ENV, 300)
        assert forked is not None, "the probe server did not run it"
        fresh = command(path, text, *flags)
        assert forked.returncode == fresh.returncode
        if fresh.returncode == 0:
            parsed, expected = (json.loads(done.stdout.strip().splitlines()[-1]) for done in (forked, fresh))
            for read in (parsed, expected):  # transformers 4 names its default after the second it was read
                read["fields"]["training"].pop("logging_dir", None)
            assert parsed == expected
            assert parsed["fields"]["training"]["max_length"] == 32  # the flag over the file
        else:  # argparse's own line, naming the value it refused
            errors = [[line for line in done.stderr.splitlines() if "error:" in line] for done in (forked, fresh)]
            assert errors[0] == errors[1] and "invalid int value: 'abc'" in errors[0][-1]


def test_where_the_server_cannot_fork_it_the_command_runs(tmp_path, monkeypatch):
    def no_server(*args):
        raise OSError("no fork here")

    monkeypatch.setattr(_trl_read, "_forked", no_server)
    done = _trl_read.read_trl_config("sft", str(tmp_path / "sft.yaml"), (), FILE, ENV, 300)
    assert done.returncode == 0 and json.loads(done.stdout.strip().splitlines()[-1])["fields"]["training"][
        "per_device_train_batch_size"] == 4
    ran = []
    monkeypatch.setattr(_trl_read, "_forked", lambda *args: None)  # forked, but CUDA was initialized in the server
    monkeypatch.setattr(_trl_read.subprocess, "run", lambda argv, **kwargs: ran.append((argv, kwargs)) or "done")
    assert _trl_read.read_trl_config("sft", "x.yaml", ("--max_length", "8"), REFUSED, ENV, 300) == "done"
    ((argv, kwargs),) = ran
    assert argv[1:] == ["-m", "autofit.probe._trl_config", "sft", "x.yaml", "--max_length", "8"]
    assert kwargs["input"] == REFUSED and kwargs["env"] == ENV and kwargs["timeout"] == 300


def test_a_server_that_initialized_cuda_reads_nothing(monkeypatch):
    """A process forked after CUDA was initialized could not hide the GPU: it exits at once, and the caller runs the
    command instead."""
    from autofit.probe import _child

    monkeypatch.setattr(_child, "inherited_cuda", lambda: "CUDA was initialized in the probe server")
    with pytest.raises(SystemExit) as exited:
        _trl_read._child(["sft", "x.yaml"], FILE, "/nonexistent/out", "/nonexistent/err", "/", {})
    assert exited.value.code == _trl_read.UNFORKABLE
