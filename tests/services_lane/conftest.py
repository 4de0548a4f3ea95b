"""Real Redis and PostgreSQL servers on loopback for the workers' lane (`make test-services`, which installs them with
apt-get where missing): each started once per session in a temporary folder, on a free port, and stopped after."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

if not os.environ.get("AUTOFIT_SERVICES_LANE"):
    pytest.skip("the workers' lane runs under `make test-services` (real Redis and PostgreSQL servers)",
                allow_module_level=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def missing(what: str) -> None:
    message = f"{what} is not installed: `make services` installs it (as root, with apt-get)"
    if os.environ.get("AUTOFIT_REQUIRE_SERVICES"):
        pytest.fail(message)
    pytest.skip(message)


def wait_for_port(port: int, process: subprocess.Popen, log: Path, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}): {log.read_text()[-2000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the server did not listen on port {port} within {seconds:g} s")


REDIS_PASSWORD = "redis-Pw-7f3a9c"  # noqa: S105 - a loopback server of the tests' own
PG_PASSWORD = "pg-Pw-41b2e8"  # noqa: S105 - trust authentication: accepted, and must never be shown


@pytest.fixture(scope="session")
def service_passwords():
    return REDIS_PASSWORD, PG_PASSWORD


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    exe = shutil.which("redis-server")
    if exe is None:
        missing("redis-server")
    folder, port = tmp_path_factory.mktemp("redis"), free_port()
    log = folder / "redis.log"
    with open(log, "w") as out:
        server = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                   "--dir", str(folder), "--requirepass", REDIS_PASSWORD], stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, server, log)
        yield f"redis://127.0.0.1:{port}/0"  # its password comes from $AUTOFIT_QUEUE_PASSWORD, as the docs show
    finally:
        server.terminate()
        server.wait(timeout=30)


def _postgres_bin() -> Path:
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[-1:]), None)
    if found is None:
        missing("PostgreSQL (initdb)")
    return Path(os.path.realpath(found)).parent


@pytest.fixture(scope="session")
def postgres_url():
    bindir = _postgres_bin()
    # PostgreSQL refuses to run as root: as root (CI), the server runs as the postgres user the package created
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    folder = Path(tempfile.mkdtemp(prefix="autofit-pg-"))
    data, log, port = folder / "data", folder / "server.log", free_port()
    if as_user:
        shutil.chown(folder, "postgres", "postgres")
    run = lambda *words: subprocess.run([*as_user, *map(str, words)], check=True, capture_output=True, text=True)  # noqa: E731
    try:
        run(bindir / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        run(bindir / "pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o",
            f"-p {port} -c listen_addresses=127.0.0.1 -k {folder} -c fsync=off", "start")
        run(bindir / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "postgres", "autofit")
        yield f"postgresql://postgres:{PG_PASSWORD}@127.0.0.1:{port}/autofit"  # on the command line, as users still may
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
