"""The pid-file kill, checked harder (issue 35, item 11): the check and the kill are about one process (a pidfd), a
process that only reads the probe's log (``tail -f``) is not a probe, a killed probe's own children die with it, and
an --out that other users of its group may write is refused like a world-writable one."""

import json
import os
import subprocess
import sys
import time

import pytest
from fakes import process_running

from autofit.core import InputError
from autofit.machine._outdir import PID_FILE, _descendants, check_owned, kill_orphan_probes, process_start_ticks


def probe_folder(tmp_path):
    folder = tmp_path / "out" / "probes" / "abc-2"
    folder.mkdir(parents=True)
    (folder / "probe.log").write_text("")
    return folder


def claim(folder, pid):
    (folder / PID_FILE).write_text(json.dumps({"pid": pid, "start": process_start_ticks(pid)}))


def wait_until(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_a_tail_of_the_probe_log_is_not_a_probe(tmp_path):
    folder = probe_folder(tmp_path)
    tail = subprocess.Popen(["tail", "-f", str(folder / "probe.log")], stdout=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: any(os.readlink(f"/proc/{tail.pid}/fd/{fd}") == str(folder / "probe.log")
                                      for fd in os.listdir(f"/proc/{tail.pid}/fd")))
        claim(folder, tail.pid)
        start = process_start_ticks(tail.pid)
        assert kill_orphan_probes(tmp_path / "out") == []
        assert process_running(tail.pid, start)  # a user watching the log keeps watching
    finally:
        tail.kill()
        tail.wait()


CHILD_PROBE = """
import os, subprocess, sys, time
log = open(sys.argv[1], "a")  # a probe writes its output to its log
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_killed_probes_children_die_with_it(tmp_path):
    folder = probe_folder(tmp_path)
    probe = subprocess.Popen([sys.executable, "-c", CHILD_PROBE, str(folder / "probe.log")], stdout=subprocess.PIPE,
                             text=True)
    try:
        child = int(probe.stdout.readline())
        child_start = process_start_ticks(child)
        assert child in _descendants(probe.pid)
        claim(folder, probe.pid)
        notes = kill_orphan_probes(tmp_path / "out")
        assert notes and f"pid {probe.pid}" in notes[0]
        probe.wait(10)
        assert wait_until(lambda: not process_running(child, child_start)), "the probe's child outlived it"
    finally:
        probe.kill()
        probe.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another group needs root")
def test_an_out_its_group_may_write_is_refused_unless_the_group_is_the_users_own(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o770)
    check_owned(out)  # the user's own group
    os.chown(out, os.geteuid(), 4242)  # a team's group
    with pytest.raises(InputError, match="can be written by its group"):
        check_owned(out)
    os.chmod(out, 0o750)
    check_owned(out)
