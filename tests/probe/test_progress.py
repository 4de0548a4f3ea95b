"""The live progress line (autofit.probe._progress), the phase file a probe keeps (autofit.probe._instrument.PhaseFile),
and how the runner and the search drive them. No training: the runner tests use factories that sleep or fail."""

import io
import logging
import os
import time
from pathlib import Path

import pytest
from fakes import spec_of
from rich.console import Console

from autofit.core import Candidate, Outcome
from autofit.machine import PHASE_FILE
from autofit.probe import LineProgress, LiveProgress, PlainProgress, ProbeProgress, ProcessRunner, make_progress
from autofit.probe._instrument import PhaseFile
from autofit.rungs import resolve_ladder
from autofit.search import Search

try:
    from fakes import FormulaRunner, MiB
except ImportError:
    from tests.fakes import FormulaRunner, MiB

CANDIDATE = Candidate("sft", "tiny-qwen2", "cpu", micro_batch=4, grad_accum=2, max_length=128, checkpointing=True,
                      rungs=("micro-batch", "checkpointing"))


class Tty(io.StringIO):
    def isatty(self):
        return True


class Recording(ProbeProgress):
    def __init__(self):
        self.events = []

    def start(self, index, level, kind, candidate, predicted_bytes, budget_bytes):
        self.events.append(("start", index, kind, candidate.key()))

    def poll(self, probe_dir):
        phase = Path(probe_dir) / PHASE_FILE
        self.events.append(("poll", Path(probe_dir), phase.read_text() if phase.exists() else None))

    def finish(self):
        self.events.append(("finish",))


# -- which display ------------------------------------------------------------------------------------------------
def test_a_line_per_probe_start_off_a_terminal_nothing_more_when_quiet(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    assert type(make_progress(stream=io.StringIO())) is LineProgress
    assert type(make_progress(quiet=True, stream=Tty())) is PlainProgress
    assert type(make_progress(quiet=True, stream=io.StringIO())) is PlainProgress
    assert type(make_progress(stream=Tty())) is LiveProgress
    monkeypatch.setenv("TERM", "dumb")
    assert type(make_progress(stream=Tty())) is LineProgress


def test_piped_a_probe_says_when_it_starts(caplog):
    """Issue 31, item 7: piped or in CI, nothing was printed between probe lines that take minutes."""
    progress = make_progress(stream=io.StringIO())
    with caplog.at_level(logging.INFO, logger="autofit.probe._progress"):
        progress.around(lambda: None, 3, 2, "probe", CANDIDATE, 150 * MiB, 300 * MiB)()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == ("probe 3     [micro-batch+checkpointing] mb=4x2 len=128 ckpt: started, predicted 150.00 MiB of "
                    "300.00 MiB")


def probe_folder(root, candidate):
    """A probe's folder as the runner names it (``probes/<candidate key>-<steps>``)."""
    folder = root / f"{candidate.key()}-2"
    folder.mkdir()
    return folder


# -- what it shows ------------------------------------------------------------------------------------------------
def test_live_line_shows_the_probe_its_memory_phase_and_time_left(tmp_path):
    out = io.StringIO()
    now = [1000.0]
    progress = LiveProgress(Console(file=out, force_terminal=True, width=200), clock=lambda: now[0])

    progress.start(3, 2, "probe", CANDIDATE, 276.2 * MiB, 300 * MiB)
    folder = probe_folder(tmp_path, CANDIDATE)
    (folder / PHASE_FILE).write_text("forward_backward")
    progress.poll(folder)
    now[0] += 12
    first = progress.line()
    progress.finish()
    shown = out.getvalue()
    assert "probe 3 [micro-batch+checkpointing] mb=4x2 len=128 ckpt" in shown
    assert "predicted 276.20 MiB of 300.00 MiB" in shown and "forward/backward" in shown
    assert first.endswith("forward/backward · 0:12 · search 0:12") and "left" not in first  # no estimate yet

    now[0] += 1  # between probes: the search's log line, the memory model
    larger = CANDIDATE.replace(micro_batch=8, grad_accum=1)
    progress.start(4, 2, "probe", larger, None, 300 * MiB)
    now[0] += 5
    progress.poll(folder)  # the first probe's folder: not the one shown (probes side by side)
    assert progress.phase is None
    folder = probe_folder(tmp_path, larger)
    (folder / PHASE_FILE).write_text("optimizer_step")
    progress.poll(folder)  # a new phase is drawn at once
    assert "mb=8x1 len=128 ckpt · budget 300.00 MiB · optimizer step · 0:05 · ~0:07 left (mean of 1 probe) · " \
           "search 0:18" in out.getvalue()
    now[0] += 10
    assert "0:15 · longer than the mean of 1 probe (0:12)" in progress.line()
    progress.finish()

    progress.start(5, 2, "verify", CANDIDATE, 276.2 * MiB, 300 * MiB)  # a verification is timed apart
    assert "verify 5 [micro-batch+checkpointing]" in progress.line() and "left" not in progress.line()
    progress.close()
    assert progress.durations == {"probe": [12.0, 15.0], "verify": [0.0]}


def test_poll_before_the_probe_wrote_its_phase_keeps_quiet(tmp_path):
    progress = LiveProgress(Console(file=io.StringIO(), force_terminal=True, width=200))
    progress.start(1, 0, "probe", CANDIDATE, None, None)
    progress.poll(tmp_path / "not-there")
    assert progress.phase is None and "[micro-batch+checkpointing] mb=4x2 len=128 ckpt · 0:00" in progress.line()
    progress.close()


def test_a_warning_logged_while_the_line_is_shown_is_written_above_it():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    handler = logging.StreamHandler(out)
    logger = logging.getLogger("autofit")
    logger.addHandler(handler)
    try:
        progress = LiveProgress(console)
        progress.start(1, 0, "probe", CANDIDATE, None, None)
        logging.getLogger("autofit.probe._runner").warning("probe disturbed")
        assert handler.stream is not out  # through rich, which draws it above the line
        progress.finish()
        assert handler.stream is out
    finally:
        logger.removeHandler(handler)
    assert "probe disturbed" in out.getvalue()


# -- the probe's side ---------------------------------------------------------------------------------------------
def test_phase_file_is_written_on_change_only(tmp_path):
    path = tmp_path / PHASE_FILE
    phases = PhaseFile(path)
    phases.write("load")
    assert path.read_text() == "load"
    path.write_text("changed by someone else")
    phases.write("load")  # the same phase again: not written
    assert path.read_text() == "changed by someone else"
    phases.write("forward_backward")
    assert path.read_text() == "forward_backward"
    assert sorted(p.name for p in tmp_path.iterdir()) == [PHASE_FILE]  # no temporary file left


def test_phase_file_follows_the_meter(tmp_path):
    class Meter:
        def __init__(self):
            self.phases = []

        def set_phase(self, name):
            self.phases.append(name)

    meter = Meter()
    PhaseFile(tmp_path / PHASE_FILE).follow(meter)
    meter.set_phase("load")
    meter.set_phase("train_setup")
    assert meter.phases == ["load", "train_setup"] and (tmp_path / PHASE_FILE).read_text() == "train_setup"


def test_phase_file_that_cannot_be_written_does_not_raise(tmp_path):
    (tmp_path / "a-file").write_text("")
    PhaseFile(tmp_path / "a-file" / PHASE_FILE).write("load")  # its folder is a file
    PhaseFile(tmp_path / "missing" / PHASE_FILE).write("load")
    PhaseFile(None).write("load")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_phase_file_in_a_read_only_folder_does_not_raise(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        PhaseFile(folder / PHASE_FILE).write("load")
    finally:
        folder.chmod(0o700)
    assert list(folder.iterdir()) == []


# -- the runner and the search ------------------------------------------------------------------------------------
def test_runner_polls_the_probe_folder_while_the_probe_runs(tmp_path):
    progress = Recording()
    runner = ProcessRunner("probe_factories:sleeps_then_fails", 2**30, tmp_path, timeout_s=120, progress=progress)
    candidate = Candidate("sft", "tiny-qwen2", "cpu", micro_batch=1, grad_accum=1, max_length=16)
    result = runner.run(candidate, 2)
    assert result.outcome is Outcome.CRASH and "slept, then failed" in result.error
    probe_dir = tmp_path / "probes" / f"{candidate.key()}-2"
    polls = [event for event in progress.events if event[0] == "poll"]
    assert polls and all(event[1] == probe_dir for event in polls)
    assert "load" in [event[2] for event in polls]  # the worker's phase, read while the factory slept
    assert (probe_dir / PHASE_FILE).read_text() == "load"


def test_runner_timeout_still_kills_the_probe(tmp_path):
    progress = Recording()
    runner = ProcessRunner("probe_factories:hangs", 2**30, tmp_path, timeout_s=3, progress=progress)
    started = time.monotonic()
    result = runner.run(Candidate("sft", "tiny-qwen2", "cpu", micro_batch=1, grad_accum=1, max_length=16), 2)
    assert result.outcome is Outcome.TIMEOUT and "time limit" in result.error
    assert time.monotonic() - started < 30
    assert 3 <= len([event for event in progress.events if event[0] == "poll"]) <= 8  # about every 0.5 s


def test_search_shows_the_probes_it_runs_not_those_it_reuses(tmp_path, caplog):
    spec = spec_of(model="tiny-qwen2", budget_bytes=350 * MiB, out_dir=tmp_path, max_length=512, device="cpu",
                      predict=False, verify_steps=10)
    progress = Recording()
    caplog.set_level(logging.INFO, logger="autofit")
    original_finish = progress.finish
    progress.finish = lambda: (original_finish(), progress.events.append(("lines", len(caplog.records))))
    report = Search(spec, FormulaRunner(spec.budget_bytes), resolve_ladder(None), progress=progress).run()
    starts = [event for event in progress.events if event[0] == "start"]
    assert len(starts) == report.probes_run >= 2
    assert [e[1] for e in starts] == list(range(1, len(starts) + 1))  # the number the probe's log line gets
    assert starts[-1][2] == "verify"
    kinds = [event[0] for event in progress.events]
    assert kinds == ["start", "finish", "lines"] * len(starts)
    # each finish comes before that probe's log line
    lines_before = [event[1] for event in progress.events if event[0] == "lines"]
    probe_lines = [i for i, r in enumerate(caplog.records) if r.getMessage().startswith(("probe ", "verify "))]
    assert all(line >= before for line, before in zip(probe_lines, lines_before, strict=False))

    again = Recording()
    Search(spec, FormulaRunner(spec.budget_bytes), resolve_ladder(None), progress=again).run()
    assert again.events == []  # every result reused from the study
