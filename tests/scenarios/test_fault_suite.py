"""Faults of shared, messy machines, as a user meets them: a search killed with SIGKILL, two searches on one folder,
probes that abort or run the host out of memory, a damaged study, a busy device (the simulated device's "other
process", autofit.machine._others), an ``--out`` that is a file."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fakes import spec_of

from autofit import cli, probe_kit
from autofit.core import Candidate, InputError, Outcome
from autofit.machine import cache_dir, resolve_model
from autofit.machine._files import entry_problem
from autofit.machine._outdir import PID_FILE, exclusive, kill_orphan_probes, process_start_ticks
from autofit.probe import ProcessRunner
from autofit.rungs import resolve_ladder
from autofit.search import STUDY_FILE, Search

try:
    from fakes import FormulaRunner, MiB
except ImportError:
    from tests.fakes import FormulaRunner, MiB

TESTS = Path(__file__).resolve().parents[1]
SEARCH = ["search", "--model", "tiny-qwen2", "--device", "cpu", "--max-length", "16", "--effective-batch", "2"]


def env_with_tests():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# -- fast: no training --------------------------------------------------------------------------------------------
def test_a_second_search_on_the_same_out_exits_2_naming_the_first(tmp_path, capsys):
    with exclusive(tmp_path):
        code = cli.main(SEARCH + ["--gpu-memory", "1GiB", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"another autofit search is running on {tmp_path}: pid {os.getpid()}" in err
    assert not list(tmp_path.glob("probes/*"))


def test_a_lock_left_by_a_killed_search_is_taken_over(tmp_path):
    (tmp_path / "search.lock").write_text(json.dumps({"pid": 4_000_000, "started": 0, "host": "h", "argv": ["x"],
                                                      "released": False}))
    with exclusive(tmp_path) as notes:
        assert any("ended without releasing it" in note and "pid 4000000" in note for note in notes)
    with exclusive(tmp_path) as notes:  # released cleanly this time
        assert notes == []


def test_out_that_is_a_file_is_bad_input(tmp_path, capsys):
    target = tmp_path / "best.txt"
    target.write_text("mine")
    code = cli.main(SEARCH + ["--gpu-memory", "1GiB", "--out", str(target)])
    assert code == 2 and "is a file" in capsys.readouterr().err
    assert target.read_text() == "mine"


def test_a_damaged_study_keeps_its_valid_records(tmp_path):
    def search():
        spec = spec_of(model="tiny-qwen2", budget_bytes=350 * MiB, out_dir=tmp_path, max_length=512,
                          device="cpu", predict=False, verify_steps=10)
        runner = FormulaRunner(spec.budget_bytes)
        return Search(spec, runner, resolve_ladder(None)).run(), runner

    first, _ = search()
    journal = tmp_path / STUDY_FILE
    with open(journal, "a") as handle:  # a stray line, then a record written after it
        handle.write("garbage {not json\n" + json.dumps({"op_code": 0, "worker_id": "x"}) + "\n")
    second, runner = search()
    assert any("was damaged" in note for note in second.notes)
    assert (tmp_path / (STUDY_FILE + ".damaged")).is_file()
    assert runner.calls == [] and second.chosen.candidate.key() == first.chosen.candidate.key()


def test_a_journal_cut_mid_write_is_repaired_on_the_first_resume(tmp_path):
    """Issue 30, item 7: a record cut short (a full disk) was skipped by Optuna's reader, which then appended the
    next record to it: the first resume died on a line no reader can parse. Now it resumes and keeps resuming."""
    def search(budget):
        spec = spec_of(model="tiny-qwen2", budget_bytes=budget, out_dir=tmp_path, max_length=512, device="cpu",
                       predict=False, verify_steps=10)
        runner = FormulaRunner(spec.budget_bytes)
        return Search(spec, runner, resolve_ladder(None)).run(), runner

    first, _ = search(350 * MiB)
    journal = tmp_path / STUDY_FILE
    with open(journal, "a") as handle:
        handle.write('{"op_code": 5, "worker_id": "x", "trial_id": 1, "sta')  # no space left mid-record
    second, runner = search(350 * MiB)
    assert any("was damaged or cut short" in note for note in second.notes)
    assert runner.calls == [] and second.chosen.candidate.key() == first.chosen.candidate.key()
    third, runner = search(300 * MiB)  # another question in the same journal: new records appended
    assert runner.calls and third.fits
    lines = journal.read_bytes().splitlines(keepends=True)
    assert all(line.endswith(b"\n") and isinstance(json.loads(line), dict) for line in lines)


@pytest.mark.slow
def test_a_full_disk_is_one_line_naming_the_file_and_the_search_resumes(tmp_path):
    """Issue 30, item 7 (ENOSPC writing the study or best.* was a traceback, exit 1) and issue 35, items 4 and 14: the
    journal really fills what it may write (``ulimit -f``, a size-limited file: EFBIG, what a quota or a full disk
    does to the same write), the search stops with one line naming it, and the same command then resumes, keeping
    the probe the journal held and repairing the record cut short."""
    import resource

    config = resolve_model("tiny-qwen2").config
    probe_kit.random_checkpoint(config, "tiny-qwen2")  # the probes' checkpoint is the cache's, built before the limit
    out = tmp_path / "out"
    # --no-predict: nothing here is the memory model's, and without it neither fresh process measures this machine's
    # rates for the speed model (about 12 s of CPU each)
    command = [sys.executable, "-m", "autofit.cli", *SEARCH, "--gpu-memory", "300MiB", "--verify-steps", "2",
               "--no-predict", "--out", str(out)]
    limit = 5500  # one probe's records (about 4.5 kB) fit in the journal; the second's do not

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    full = subprocess.run(command, preexec_fn=limited, capture_output=True, text=True, timeout=900)
    err = [line for line in full.stderr.splitlines() if line.startswith("autofit: error")]
    assert full.returncode == 4 and "Traceback" not in full.stderr, full.stderr
    journal = out / STUDY_FILE
    assert len(err) == 1 and f"File too large writing {journal}" in err[0] and "ulimit -f" in err[0], err
    assert "resumes" in err[0] and journal.stat().st_size <= limit and not (out / "best.json").exists()
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "best.json").read_text())["fits"] is True
    reused = int(resumed.stdout.split(" reused from ")[0].rsplit(", ", 1)[1])
    assert reused >= 1  # the probe the journal held is not run again
    lines = journal.read_bytes().splitlines(keepends=True)
    assert all(line.endswith(b"\n") and isinstance(json.loads(line), dict) for line in lines)


def test_a_busy_device_is_named_before_any_probe(tmp_path, capsys, monkeypatch):
    others = tmp_path / "others"
    others.write_text(str(200 * MiB))
    monkeypatch.setenv("AUTOFIT_SIMULATED_OTHERS_FILE", str(others))
    code = cli.main(SEARCH + ["--gpu-memory", "300MiB", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "100.00 MiB free, less than the budget 300.00 MiB" in err
    assert "simulated other process) holds 200.00 MiB" in err and "--allow-busy-gpu" in err
    assert not list((tmp_path / "out").glob("probes/*"))


def live_process(log_path=None):
    """A ``sleep``, with its output in ``log_path`` when given (as a probe of that folder writes to its log)."""
    if log_path is None:
        return subprocess.Popen(["sleep", "60"])
    with open(log_path, "a") as log:
        return subprocess.Popen(["sleep", "60"], stdout=log, stderr=log)


def pid_file_for(process, folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PID_FILE).write_text(json.dumps({"pid": process.pid, "start": process_start_ticks(process.pid)}))


def test_a_planted_or_copied_pid_file_kills_no_process_but_this_folders_probes(tmp_path):
    """Issue 30, item 5: a pid file is a claim. A planted one naming an unrelated process of the user, and one copied
    with another search's --out (naming its live probe), kill nothing; the real orphan of this folder is killed."""
    unrelated = live_process()
    other = tmp_path / "other-search" / "probes" / "abc-2"
    other.mkdir(parents=True)
    their_probe = live_process(other / "probe.log")
    try:
        pid_file_for(unrelated, tmp_path / "out" / "probes" / "planted-2")
        pid_file_for(their_probe, other)
        shutil.copytree(tmp_path / "other-search" / "probes", tmp_path / "out" / "probes", dirs_exist_ok=True)
        with exclusive(tmp_path / "out") as notes:
            assert notes == []
        assert unrelated.poll() is None and their_probe.poll() is None  # both alive
        assert not list((tmp_path / "out").glob("probes/*/pid"))  # the claims are dropped
        assert any("killed probe pid" in note for note in kill_orphan_probes(tmp_path / "other-search"))
        assert their_probe.wait(timeout=10) == -signal.SIGKILL and unrelated.poll() is None
    finally:
        for process in (unrelated, their_probe):
            if process.poll() is None:
                process.kill()
            process.wait()


def test_a_cache_folder_others_can_write_to_is_refused_before_any_probe(tmp_path, monkeypatch, capsys):
    """Issue 30, item 4: the cache decides what the probes load; one others could fill is refused, as --out is."""
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("AUTOFIT_CACHE", str(shared))
    with pytest.raises(InputError, match="can be written by every user"):
        cache_dir()
    code = cli.main(SEARCH + ["--gpu-memory", "1GiB", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"the cache folder {shared} can be written by every user" in err
    assert not (tmp_path / "out" / "probes").exists() and list(shared.iterdir()) == []
    os.chmod(shared, 0o1777)  # sticky, as /tmp: others cannot replace what is ours, and every level is checked
    assert cache_dir() == shared
    if os.geteuid() == 0:  # giving a folder to another user needs root
        (shared / "weightless-checkpoints").mkdir()
        os.chown(shared / "weightless-checkpoints", 4242, 4242)
        with pytest.raises(InputError, match="weightless-checkpoints belongs to another user"):
            probe_kit.checkpoint_folder(resolve_model("tiny-qwen2").config, "tiny-qwen2")
        os.chown(shared, 4242, 4242)
        with pytest.raises(InputError, match="shared-cache belongs to another user"):
            cache_dir()


def test_a_link_planted_in_the_cache_is_never_written_through(tmp_path, monkeypatch):
    """Issue 30, item 4: links planted where a weightless checkpoint and its lock are written (a stale entry's .lock
    once truncated its target) are replaced, never written through."""
    monkeypatch.setenv("AUTOFIT_CACHE", str(tmp_path / "cache"))
    config = resolve_model("tiny-qwen2").config
    folder = probe_kit.checkpoint_folder(config, "tiny-qwen2")
    folder.mkdir(parents=True)
    names = [".lock", "config.json", "model.safetensors", "tokenizer.json", ".autofit-virtual",
             ".autofit-manifest.json"]
    victims = {name: tmp_path / f"victim-{index}" for index, name in enumerate(names)}
    for name, victim in victims.items():
        victim.write_text("precious")
        (folder / name).symlink_to(victim)
    assert probe_kit.random_checkpoint(config, "tiny-qwen2") == folder
    shutil.rmtree(folder)
    for lock in folder.parent.glob(".*.lock"):  # the entry's lock, planted as a link this time
        lock.unlink()
        lock.symlink_to(victims[".lock"])
    assert probe_kit.random_checkpoint(config, "tiny-qwen2") == folder
    assert all(victim.read_text() == "precious" for victim in victims.values())
    assert not any(path.is_symlink() for path in folder.iterdir())
    assert entry_problem(folder, probe_kit._entry_key(config, "weightless")) is None


def test_a_damaged_cache_entry_is_built_again_with_a_line_naming_it(tmp_path, monkeypatch, caplog):
    """Issue 30, item 6: a truncated model.safetensors or an edited config.json in the cache was trusted forever
    (every later search failed, exit 4, without naming the cache)."""
    monkeypatch.setenv("AUTOFIT_CACHE", str(tmp_path / "cache"))
    config = resolve_model("tiny-qwen2").config
    folder = probe_kit.random_checkpoint(config, "tiny-qwen2")
    weights, settings = folder / "model.safetensors", folder / "config.json"
    size, written = weights.stat().st_size, settings.read_text()
    os.truncate(weights, size // 2)
    with caplog.at_level("WARNING"):
        assert probe_kit.random_checkpoint(config, "tiny-qwen2") == folder
    assert weights.stat().st_size == size
    assert f"the cache entry {folder} is damaged" in caplog.text and "model.safetensors" in caplog.text
    caplog.clear()
    settings.write_text(written.replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    with caplog.at_level("WARNING"):
        probe_kit.random_checkpoint(config, "tiny-qwen2")
    assert settings.read_text() == written and "config.json was changed" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # sound: used as it is, without a word
        probe_kit.random_checkpoint(config, "tiny-qwen2")
    assert caplog.text == ""


# -- slow: real probes ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_search_after_the_cache_was_damaged_answers(tmp_path):
    """Issue 30, item 6, end to end: a truncated checkpoint in the cache is written again by the probe that finds it,
    and the search answers as on a fresh cache. The tests' cache (tests/conftest.py): the probe server, which may
    have been started by an earlier test, sees the same."""
    argv = SEARCH + ["--gpu-memory", "2GiB", "-q", "--verify-steps", "3"]
    assert cli.main(argv + ["--out", str(tmp_path / "first")]) == 0
    folder = probe_kit.checkpoint_folder(resolve_model("tiny-qwen2").config, "tiny-qwen2")
    os.truncate(folder / "model.safetensors", 1000)
    assert cli.main(argv + ["--out", str(tmp_path / "second")]) == 0
    first, second = (json.loads((tmp_path / name / "best.json").read_text()) for name in ("first", "second"))
    assert first["config"] == second["config"]
    assert "is damaged" in "".join(path.read_text() for path in (tmp_path / "second").glob("probes/*/probe.log"))



@pytest.mark.slow
def test_busy_device_allowed_searches_within_what_is_free(tmp_path, monkeypatch):
    others = tmp_path / "others"
    others.write_text(str(100 * MiB))
    monkeypatch.setenv("AUTOFIT_SIMULATED_OTHERS_FILE", str(others))
    script = textwrap.dedent(f"""
        import sys
        from autofit import cli
        sys.exit(cli.main({SEARCH + ["--gpu-memory", "400MiB", "--allow-busy-gpu", "--verify-steps", "3", "-q",
                                     "--out", str(tmp_path / "out")]!r}))
    """)  # a fresh process: the probe server must see the simulated other process's file from its start
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    best = json.loads((tmp_path / "out" / "best.json").read_text())
    assert best["budget_bytes"] == 300 * MiB and best["verified"]["peak_bytes"] <= 300 * MiB
    assert any("the device was busy" in note for note in best["notes"])


@pytest.mark.slow
def test_an_oom_while_another_process_grew_is_run_again(tmp_path):
    others = tmp_path / "others"
    others.write_text("0")
    script = textwrap.dedent(f"""
        import json, logging
        from autofit.core._candidate import Candidate
        from autofit.probe._runner import ProcessRunner
        if __name__ == "__main__":
            logging.basicConfig(level=logging.WARNING)
            runner = ProcessRunner("probe_factories:another_process_grows_once", 2**30, {str(tmp_path)!r})
            result = runner.run(Candidate("sft", "tiny-qwen2", "cpu", micro_batch=2, grad_accum=1, max_length=16), 2)
            print("RESULT " + json.dumps(result.to_dict()))
    """)
    env = dict(env_with_tests(), AUTOFIT_SIMULATED_OTHERS_FILE=str(others))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    line = next((printed for printed in done.stdout.splitlines() if printed.startswith("RESULT ")), None)
    assert line is not None, done.stderr[-3000:]
    result = json.loads(line[len("RESULT "):])
    assert result["outcome"] == "OK"  # the OOM was the other process's, and the probe ran again
    assert "probe disturbed" in done.stderr and done.stderr.count("probe disturbed") == 1


@pytest.mark.slow
@pytest.mark.parametrize("factory, cause, words", [
    ("probe_factories:aborts", "signal-SIGABRT", "SIGABRT"),
    ("probe_factories:exhausts_host_memory", "host-memory", "MemoryError"),
])
def test_a_probe_that_aborts_or_exhausts_host_memory(tmp_path, factory, cause, words):
    runner = ProcessRunner(factory, 2**30, tmp_path, timeout_s=120)
    result = runner.run(Candidate("sft", "tiny-qwen2", "cpu", micro_batch=1, grad_accum=1, max_length=16), 2)
    assert result.outcome is Outcome.CRASH and result.cause == cause and words in result.error


@pytest.mark.slow
def test_sigkill_of_the_search_leaves_no_probe_and_the_search_resumes(tmp_path):
    argv = [*SEARCH, "--gpu-memory", "2GiB", "--verify-steps", "3", "-q", "--factory", "probe_factories:hangs_once"]
    command = [sys.executable, "-m", "autofit.cli", *argv]
    controller = subprocess.Popen(command + ["--out", str(tmp_path / "killed")], env=env_with_tests(),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid_file = wait_for(lambda: next(iter((tmp_path / "killed").glob("probes/*/pid")), None), 120, "a probe")
        wait_for(lambda: pid_file.read_text(), 30, "the probe's pid")
        probe = json.loads(pid_file.read_text())
        wait_for(lambda: (tmp_path / "killed" / "hung-once").exists(), 60, "the probe to hang")
        controller.send_signal(signal.SIGKILL)
        controller.wait(30)
        # the probe dies with its search (no orphan holding the device), well within a few seconds
        wait_for(lambda: process_start_ticks(probe["pid"]) != probe["start"], 20, "the orphan probe to die")
    finally:
        if controller.poll() is None:
            controller.kill()
    resumed = subprocess.run(command + ["--out", str(tmp_path / "killed")], env=env_with_tests(), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "hung-once").write_text("")  # the same search, never killed: the reference, run here
    assert cli.main(argv + ["--out", str(tmp_path / "clean")]) == 0
    killed_best = json.loads((tmp_path / "killed" / "best.json").read_text())
    clean_best = json.loads((tmp_path / "clean" / "best.json").read_text())
    assert killed_best["config"] == clean_best["config"]  # the same answer
    assert killed_best["probes_this_run"] == clean_best["probes_this_run"]  # only the killed probe ran again
    assert any("ended without releasing it" in note for note in killed_best["notes"])


def test_estimate_from_a_damaged_best_json_is_one_line(tmp_path, capsys):
    (tmp_path / "best.json").write_text('{"fits": true, "memory_model": {"static_scale": ')  # cut mid-write
    code = cli.main(["estimate", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "200MiB",
                     "--from", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert str(tmp_path / "best.json") in err and "cannot be read" in err


@pytest.mark.parametrize("key, value", [
    ("num_hidden_layers", 0), ("hidden_size", -256), ("hidden_size", "256"), ("vocab_size", float("nan")),
    ("num_attention_heads", 2.5), ("num_hidden_layers", True), ("model_type", "../../etc"), ("model_type", "qwen2/x"),
])
@pytest.mark.parametrize("command", ["search", "estimate"])
def test_a_hostile_value_in_the_models_config_is_one_line_exit_2_naming_the_key(tmp_path, capsys, key, value,
                                                                                 command):
    """Issue 30, item 12: refused before any probe (an estimate has none either), not predicted, probed and blamed
    on the machine."""
    config = dict(resolve_model("tiny-qwen2").config)
    config[key] = value
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))  # NaN as JSON writes it: NaN
    out = tmp_path / "out"
    code = cli.main([command, "--model", str(folder), "--device", "cpu", "--max-length", "16", "--effective-batch",
                     "2", "--gpu-memory", "1GiB"] + (["--out", str(out)] if command == "search" else []))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert key in err and str(folder / "config.json") in err
    assert not (out / "probes").exists()  # nothing ran


def test_a_model_folder_with_a_long_path_is_used_and_an_out_too_deep_is_one_line(tmp_path, capsys):
    """Issue 30, item 9: a model folder whose path is longer than a file name may be (the bundled-configuration lookup
    built a file name from it) is read; an --out too deep for the files a search writes is refused before anything
    is written, nothing left behind."""
    folder = tmp_path / ("a" * 120) / ("b" * 150)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(resolve_model("tiny-qwen2").config))
    assert len(str(folder)) > 270
    assert resolve_model(str(folder)).local_path == str(folder.resolve())
    code = cli.main(["estimate", "--model", str(folder), "--device", "cpu", "--gpu-memory", "200MiB",
                     "--max-length", "16"])
    assert code == 0, capsys.readouterr().err

    deep = tmp_path.joinpath(*["d" * 200] * 20)  # about 4,000 bytes: the path limit is 4,096
    code = cli.main(SEARCH + ["--gpu-memory", "1GiB", "--out", str(deep)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--out is a path of" in err, err
    assert list(tmp_path.iterdir()) == [tmp_path / ("a" * 120)]  # nothing written for the deep --out


def test_a_cache_on_a_full_disk_names_the_error_not_a_progress_bar():
    """Issue 30, item 8: the child's last stderr line was transformers' progress bar, drawn after the traceback."""
    stderr = ("Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\n"
              "OSError: [Errno 28] No space left on device: '/cache/tiny-qwen2-filled/model.safetensors'\n"
              "Loading weights: 100%|##########| 3/3 [00:00<00:00, 1234.5it/s]\r\n")
    assert probe_kit.error_line(stderr) == ("OSError: [Errno 28] No space left on device: "
                                            "'/cache/tiny-qwen2-filled/model.safetensors'")
    assert probe_kit.error_line("Loading weights: 100%|###| 3/3\nKilled\n") == "Killed"
    assert probe_kit.error_line("") == ""
