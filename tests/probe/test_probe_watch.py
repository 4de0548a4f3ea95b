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
        from autofit.core import record_probe_process
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
