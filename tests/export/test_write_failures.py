"""Every write failure of the study and the outputs is one line naming the file, exit 4, and the same command
resumes (issue 35, item 4): a full disk, ``ulimit -f`` (EFBIG), a quota (EDQUOT), a filesystem turned read-only
(EROFS). ``ulimit -f`` had been a traceback, exit 1: the journal's ``f.write`` names no file."""

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from autofit import cli
from autofit.machine import atomic_write_text

SEARCH = ["search", "--model", "tiny-qwen2", "--device", "cpu", "--max-length", "16", "--effective-batch", "2",
          "--gpu-memory", "1GiB"]


@pytest.mark.parametrize("code, advice", [(errno.EFBIG, "ulimit -f"), (errno.EDQUOT, "quota"),
                                          (errno.EROFS, "writable"), (errno.ENOSPC, "free some space"),
                                          (errno.EIO, "check that disk")])
def test_each_write_failure_is_one_line_exit_4(tmp_path, capsys, monkeypatch, code, advice):
    import autofit._api

    journal = str(tmp_path / "out" / "study.journal")

    def failing(*args, **kwargs):
        raise OSError(code, os.strerror(code), journal)

    monkeypatch.setattr(autofit._api, "run_search", failing)
    assert cli.main(SEARCH + ["--out", str(tmp_path / "out")]) == 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and journal in err and os.strerror(code) in err, err
    assert advice in err and "run the same command again" in err and "resumes" in err


def test_a_permission_refused_under_out_is_one_line_and_elsewhere_is_not_ours(tmp_path, capsys, monkeypatch):
    import autofit._api

    where = [str(tmp_path / "out" / "best.json")]

    def failing(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", where[0])

    monkeypatch.setattr(autofit._api, "run_search", failing)
    assert cli.main(SEARCH + ["--out", str(tmp_path / "out")]) == 4
    assert "Permission denied writing" in capsys.readouterr().err
    where[0] = "/etc/somewhere"
    with pytest.raises(PermissionError):  # not a write of ours: not dressed up as one
        cli.main(SEARCH + ["--out", str(tmp_path / "out")])


def under_file_limit(limit: int, code: str) -> subprocess.CompletedProcess:
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    return subprocess.run([sys.executable, "-c", code], preexec_fn=limited, capture_output=True, text=True,
                          timeout=300)


def test_a_file_size_limit_names_the_file_written_whole(tmp_path):
    """``f.write`` past ``ulimit -f`` raises EFBIG without a file name: best.json's writer names it."""
    target = tmp_path / "best.json"
    done = under_file_limit(1000, f"from autofit.machine import atomic_write_text\n"
                                  f"atomic_write_text({str(target)!r}, 'x' * 5000)\n")
    assert done.returncode != 0 and f"[Errno {errno.EFBIG}] File too large: '{target}'" in done.stderr
    assert not target.exists() and list(tmp_path.iterdir()) == []  # no temporary file left behind
    atomic_write_text(target, "ok")
    assert target.read_text() == "ok"


def test_the_journal_names_itself_when_a_write_fails(tmp_path):
    journal = tmp_path / "study.journal"
    done = under_file_limit(3000, f"from autofit.search._store import _NamedJournal\n"
                                  f"backend = _NamedJournal({str(journal)!r})\n"
                                  "backend.append_logs([{'op_code': 0, 'pad': 'x' * 5000}])\n")
    assert done.returncode != 0 and f"File too large: '{journal}'" in done.stderr, done.stderr
    assert Path(journal).stat().st_size <= 3000


def test_a_cache_that_cannot_take_the_trainable_checkpoint_leaves_the_answer_written(tmp_path, monkeypatch):
    """Issue 35, item 3: a full cache disk while the trainable checkpoint best.yaml names was written: a traceback
    through the export, exit 1, and no best.* though every probe had run. The answer is written first; the
    checkpoint's failure is one line; the same command (which probes nothing again) finishes it."""
    from fakes import FormulaRunner, MiB, spec_of

    from autofit import export
    from autofit.export import _write
    from autofit.machine import resolve_model
    from autofit.probe.kit import trainable_folder
    from autofit.rungs import resolve_ladder
    from autofit.search import InfrastructureError, Search

    spec = spec_of(model="tiny-qwen2", budget_bytes=350 * MiB, out_dir=tmp_path, max_length=512, device="cpu",
                   predict=False, verify_steps=10)
    report = Search(spec, FormulaRunner(spec.budget_bytes), resolve_ladder(None)).run()
    assert report.fits
    folder = trainable_folder(resolve_model("tiny-qwen2").config, "tiny-qwen2")

    def full(config, name):
        raise RuntimeError(f"could not write a random-weight checkpoint of {name} to {folder}: OSError: [Errno 28] "
                           f"No space left on device: '{folder}/model.safetensors'")

    monkeypatch.setattr(_write, "trainable_checkpoint", full)
    with pytest.raises(InfrastructureError) as caught:
        export.write(report, tmp_path)
    message = str(caught.value)
    assert "\n" not in message and "No space left on device" in message and "run the same command again" in message
    assert f"model_name_or_path: \"{folder}\"" in (tmp_path / "best.yaml").read_text()
    assert (tmp_path / "best.json").is_file()
    built = []
    monkeypatch.setattr(_write, "trainable_checkpoint", lambda config, name: built.append(name))
    export.write(report, tmp_path)
    assert built == ["tiny-qwen2"]
