"""A probe dies at once with its search (issue 35, item 12): the kernel's parent-death signal reaches a forked probe
only when its parent, the probe server, exits, and a server that takes seconds to shut down (torch preloaded in it)
left the probe training 3-10 s after the search was killed. The probe now watches the search itself."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from fakes import process_running

SEARCH = textwrap.dedent("""
    import multiprocessing, sys, time
    from pathlib import Path

    def probe(folder):
        from autofit.machine import record_probe_process
        record_probe_process(Path(folder))
        time.sleep(300)

    if __name__ == "__main__":
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["lingers"])  # a probe server that takes 20 s to shut down
        context.Process(target=probe, args=(sys.argv[1],)).start()
        time.sleep(300)
""")


def test_a_probe_dies_at_once_when_its_search_is_killed_though_its_server_lingers(tmp_path):
    (tmp_path / "lingers.py").write_text("import atexit, time\natexit.register(time.sleep, 20)\n")
    (tmp_path / "search.py").write_text(SEARCH)
    folder = tmp_path / "probe"
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    search = subprocess.Popen([sys.executable, str(tmp_path / "search.py"), str(folder)], cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (folder / "pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        probe = json.loads((folder / "pid").read_text())
        assert process_running(probe["pid"], probe["start"])
        search.send_signal(signal.SIGKILL)
        search.wait(10)
        killed = time.monotonic()
        while process_running(probe["pid"], probe["start"]) and time.monotonic() - killed < 15:
            time.sleep(0.05)
        assert not process_running(probe["pid"], probe["start"]), "the probe outlived its search"
        assert time.monotonic() - killed < 3
    finally:
        if search.poll() is None:
            search.kill()
            search.wait()


def test_a_probe_that_cannot_create_its_log_exits_quietly_and_the_disk_is_named(tmp_path):
    """Issue 50, item 4: on a disk out of inodes the search's exit 4 was right, but each probe child printed a
    13-line traceback to the user's terminal first (its log could not be created, so its stderr was still the
    terminal's). It now exits with EX_CANTCREAT, silently, and the runner names the disk."""
    import subprocess
    import sys

    from autofit.core import INFRASTRUCTURE
    from autofit.probe._classify import CANNOT_CREATE_EXIT, classify_exit

    missing = tmp_path / "gone" / "probe.log"  # as a log no inode is left for: os.open fails
    code = ("from autofit.probe._worker import child_main\n"
            f"child_main(None, None, None, {str(tmp_path / 'result.json')!r}, {str(missing)!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == CANNOT_CREATE_EXIT and done.stderr == "" and done.stdout == ""
    result = classify_exit(done.returncode, timed_out=False)
    assert result.fault == INFRASTRUCTURE and result.cause == "disk" and "could not create its log" in result.error
