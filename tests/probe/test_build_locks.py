"""A probe that waits on a killed build's lock (a torch extension's ``lock`` file, left by a DeepSpeed op build that
was interrupted) is the machine's failure, named with the file and the fix; the search stops at the first one
instead of running it again and timing out on every candidate."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fakes import spec_of

from autofit.core import INFRASTRUCTURE, Candidate, Outcome
from autofit.probe import STALE_LOCK_CAUSE, ProcessRunner
from autofit.probe._build_locks import stale_build_locks
from autofit.probe._classify import classify_exit
from autofit.rungs import resolve_ladder
from autofit.search import InfrastructureError, Search

CANDIDATE = Candidate("sft", "tiny-qwen2", "cpu", micro_batch=1, grad_accum=1, max_length=16)


def _lock(root: Path, age_s: float) -> Path:
    lock = root / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


@pytest.fixture
def extensions(tmp_path, monkeypatch):
    root = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    return root


@pytest.mark.parametrize("named", [True, False])
def test_the_lock_torch_takes_is_one_the_probe_finds(tmp_path, monkeypatch, named):
    # torch.utils.cpp_extension.load builds in _get_build_directory(name) under a FileBaton of its "lock" file:
    # $TORCH_EXTENSIONS_DIR/<op>/lock, else <cache>/torch_extensions/py311_cpu/<op>/lock
    from torch.utils.cpp_extension import _get_build_directory

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if named:
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    else:
        monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    lock = Path(_get_build_directory("deepspeed_shm_comm", verbose=False)) / "lock"
    lock.touch()
    assert stale_build_locks(time.time() + 1) == [lock]
    assert stale_build_locks(time.time() - 60) == []  # taken after the probe started: a build under way


def test_a_probe_out_of_time_on_a_stale_lock_is_the_machines(extensions, tmp_path):
    lock = _lock(extensions, age_s=3600)
    result = ProcessRunner("probe_factories:hangs", 2**30, tmp_path / "work", timeout_s=3).run(CANDIDATE, 2)
    assert result.outcome is Outcome.CRASH and result.fault == INFRASTRUCTURE and result.cause == STALE_LOCK_CAUSE
    assert str(lock) in result.error


@pytest.mark.slow
def test_a_probe_of_two_ranks_names_the_lock_too(extensions, tmp_path):
    # both ranks are killed at the time limit (rank 1 sleeps, rank 0 waits for it): each is the lock's, and so is
    # the one result the ranks give
    lock = _lock(extensions, age_s=3600)
    runner = ProcessRunner("probe_factories:rank_one_hangs", None, tmp_path / "work", timeout_s=8)
    result = runner.run(CANDIDATE.replace(max_length=64, ranks=2), 2)
    assert result.outcome is Outcome.CRASH and result.cause == STALE_LOCK_CAUSE and str(lock) in result.error


def test_a_lock_newer_than_the_probe_or_none_leaves_the_time_out_the_candidates(extensions):
    lock = _lock(extensions, age_s=5)
    assert classify_exit(None, True, started=time.time() - 60).outcome is Outcome.TIMEOUT  # a build under way
    assert classify_exit(None, True, started=time.time()).cause == STALE_LOCK_CAUSE
    assert classify_exit(None, False, started=time.time()).cause != STALE_LOCK_CAUSE  # a probe that ended itself
    lock.unlink()
    assert classify_exit(None, True, started=time.time()).outcome is Outcome.TIMEOUT


def test_the_search_stops_at_the_first_with_the_file_and_the_fix(extensions, tmp_path):
    lock = _lock(extensions, age_s=3600)
    spec = spec_of(model="tiny-qwen2", budget_bytes=2**30, out_dir=tmp_path / "out", max_length=16, device="cpu",
                   predict=False)
    runner = ProcessRunner("probe_factories:hangs", spec.budget_bytes, tmp_path / "work", timeout_s=3)
    search = Search(spec, runner, resolve_ladder(None))
    started = time.monotonic()
    with pytest.raises(InfrastructureError, match="an error every probe would meet") as raised:
        search.run()
    assert str(lock) in str(raised.value) and "rm -f" in str(raised.value)
    assert time.monotonic() - started < 60  # one probe's 3 s, not run again, not a second candidate's
    assert len(list((tmp_path / "work" / "probes").iterdir())) == 1
