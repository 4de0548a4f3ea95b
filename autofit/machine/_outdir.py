"""One search per ``--out`` at a time, and nothing an earlier search left running there.

- **The lock**: ``DIR/search.lock`` is held with ``flock`` for the whole search and says who holds it (pid, start
  time, host, command). A second search on the same folder exits 2 naming the holder: two searches would run
  every probe twice, halve each other's throughput and, on a GPU, eat each other's memory. The kernel releases a
  ``flock`` when its process dies however it dies, so a lock left by a killed search is taken over, with a note.
- **Orphan probes**: every probe records its pid and the kernel's start time of its process in
  ``DIR/probes/*/pid``, and asks the kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``; the parent of a
  forked probe is the probe server, which exits when the search does, seconds later where it shuts torch down), and
  watches the search itself, dying within a fraction of a second of it. A search that starts still kills any probe
  of an earlier run that is alive (same pid and same start time, so never a process that reused the pid) and proven
  to be a probe of this folder: it holds this probe folder's own log open (a copied ``--out`` or a planted pid file
  names a process that does not, and that process is left alone).
- **The cache**: a cache folder that another user owns or every user may write to is refused here too, before any
  probe (``autofit.machine._files.cache_dir``).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional

from autofit.core import InputError, masked
from autofit.machine._files import atomic_write_text, cache_dir

log = logging.getLogger(__name__)

LOCK_FILE = "search.lock"
PID_FILE = "pid"  # in a probe's folder: its process, for the next start to end it if it outlived the search
PHASE_FILE = "phase"  # in a probe's folder: its current phase, for the search's progress display
LOG_FILE = "probe.log"  # in a probe's folder: its output, open in the probe for its whole life
PR_SET_PDEATHSIG = 1


class OutDirBusy(InputError):
    """Another search holds this --out (CLI exit 2)."""


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        data = json.loads(path.read_text() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def masked_argv(argv: Iterable[str]) -> List[str]:
    """A command line as a file or a message may hold it: each word masked (``--worker-queue=redis://:PW@h`` too)."""
    return [masked(str(word)) for word in argv]


def _describe(holder: Dict[str, Any]) -> str:
    started = holder.get("started")
    when = datetime.datetime.fromtimestamp(started).isoformat(timespec="seconds") if isinstance(started, (int, float)) \
        else "an unknown time"
    command = " ".join(masked_argv(holder.get("argv") or []))[:200]
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {when}" + (f" ({command})" if command else "")


@contextlib.contextmanager
def exclusive(out_dir: Path) -> Iterator[List[str]]:
    """Hold ``out_dir`` for one search; yields notes (a lock taken over, orphan probes killed)."""
    check_room(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir} is a file: a folder (new or of an earlier search) is accepted")
    check_owned(out_dir)
    cache_dir()  # refused before any probe when someone else could fill it
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        raise InputError(f"--out {out_dir} cannot be written: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_json(path)
        os.close(fd)
        raise OutDirBusy(f"another autofit search is running on {out_dir}: {_describe(holder)}; wait for it to end, "
                         "or use another --out") from None
    notes = []
    previous = _read_json(path)
    if previous and not previous.get("released"):
        notes.append(f"the search that held {out_dir} before ({_describe(previous)}) ended without releasing it "
                     "(killed?): taken over")
    notes += kill_orphan_probes(out_dir)
    me = {"pid": os.getpid(), "started": time.time(), "host": socket.gethostname(), "argv": masked_argv(sys.argv),
          "released": False}
    _rewrite(fd, me)
    for note in notes:
        log.warning("%s", note)
    try:
        yield notes
    finally:
        _rewrite(fd, {**me, "released": True})
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


PATH_MAX = 4096  # Linux's limit on a whole path, in bytes
ROOM_BYTES = 512  # what autofit adds under --out (probes/NAME/rankN/probe.log, the journal's lock, report.html)


def check_room(out_dir: Path) -> None:
    """An --out so deep that the files a search writes in it would pass the system's path limit is refused before
    anything is written there (it failed midway, leaving the journal's lock behind)."""
    length = len(os.fsencode(str(out_dir.absolute())))
    if length + ROOM_BYTES > PATH_MAX:
        raise InputError(f"--out is a path of {length:,} bytes: at most {PATH_MAX - ROOM_BYTES:,} are accepted, "
                         f"leaving room for the files a search writes in it ({PATH_MAX:,} in all)")


def check_owned(out_dir: Path) -> None:
    """An --out that another user owns, or that others may write to, decides what this search writes and reads
    (a link put there for best.json, a study that poisons the answer): refused."""
    if not out_dir.exists():
        return
    check_folder_private(out_dir, f"--out {out_dir}")
    for name in ("study.journal", "probes"):
        if (out_dir / name).is_symlink():
            raise InputError(f"--out {out_dir}: {name} is a symbolic link; autofit does not write through links")


def check_folder_private(folder: Path, label: str) -> None:
    """Refuse, with one line starting with ``label``, a folder another user owns, or that every user, or a group
    with other users in it, may write to (a user's own private group, the usual with umask 002, is fine)."""
    info = folder.stat()
    if info.st_uid != os.geteuid():
        raise InputError(f"{label} belongs to another user (uid {info.st_uid}): use a folder of yours")
    if info.st_mode & 0o002:
        raise InputError(f"{label} can be written by every user (mode {oct(info.st_mode & 0o777)}): use a "
                         "folder others cannot write to, e.g. chmod o-w it")
    if info.st_mode & 0o020 and _shared_group(info.st_gid):
        raise InputError(f"{label} can be written by its group (gid {info.st_gid}, which has other users; "
                         f"mode {oct(info.st_mode & 0o777)}): use a folder others cannot write to, e.g. chmod g-w it")


def _shared_group(gid: int) -> bool:
    """A group other users are in (a user's own private group, the usual with umask 002, is not)."""
    import grp
    import pwd

    if gid != os.getegid():
        return True
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        members = set(grp.getgrgid(gid).gr_mem) - {me}
        primary = {user.pw_name for user in pwd.getpwall() if user.pw_gid == gid} - {me}
    except KeyError:
        return False
    return bool(members or primary)


def _rewrite(fd: int, data: Dict[str, Any]) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(data).encode(), 0)


def process_start_ticks(pid: int) -> Optional[int]:
    """The kernel's start time of ``pid`` (clock ticks since boot), None when it is gone or unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def record_probe_process(probe_dir: Path) -> None:
    """In the probe, once its output goes to ``probe_dir``'s log (what proves to ``kill_orphan_probes`` that it is
    this folder's probe): say who it is, and die with its parent.

    A probe forked by the probe server inherits the write end of the pipe through which the server learns that
    the search has gone (it exits when every copy is closed); a probe that kept it would keep the server, its
    parent, alive after a SIGKILL of the search, and so itself. It is closed here: the probe starts no process
    through the server."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if alive_fd is not None and os.getpid() != getattr(server, "_forkserver_pid", None):
        with contextlib.suppress(OSError):
            os.close(alive_fd)
        server._forkserver_alive_fd = None  # type: ignore[union-attr]  # server is set when alive_fd is
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the orphan check on the next start still applies
        pass
    watch_the_search()
    atomic_write_text(probe_dir / PID_FILE, json.dumps({"pid": os.getpid(), "start": process_start_ticks(os.getpid())}))


WATCH_S = 0.2  # how often a probe looks whether its search is still there


def _stat_fields(pid: int) -> List[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _search_pid() -> int:
    """The search's process as a probe sees it: its parent, or its parent's parent when the parent is the probe
    server (multiprocessing's forkserver, which outlives a killed search for seconds while it shuts down)."""
    parent = os.getppid()
    try:
        command = Path(f"/proc/{parent}/cmdline").read_bytes()
    except OSError:
        return parent
    if b"multiprocessing.forkserver" in command:
        fields = _stat_fields(parent)
        if len(fields) > 1 and fields[1].isdigit() and int(fields[1]) > 1:
            return int(fields[1])
    return parent


def watch_the_search() -> None:
    """A thread in the probe that kills it as soon as its search is gone (killed, even with SIGKILL): the kernel's
    parent-death signal reaches a forked probe only when the probe server exits, which took 3-10 s while the
    probe went on training."""
    pid = _search_pid()
    start = process_start_ticks(pid)
    if start is None:
        return  # not Linux, or nothing to watch: the parent-death signal and the orphan check remain

    def gone() -> bool:
        fields = _stat_fields(pid)
        return len(fields) < 20 or fields[0] in ("Z", "X") or int(fields[19]) != start

    def watch() -> None:
        while not gone():
            time.sleep(WATCH_S)
        os.kill(os.getpid(), signal.SIGKILL)

    import threading

    threading.Thread(target=watch, name="autofit-search-watch", daemon=True).start()


def kill_orphan_probes(out_dir: Path) -> List[str]:
    """Kill every probe of this folder that an earlier search left alive. A pid file is only a claim (copied with
    the folder, or planted): the process it names is killed only when it is the process that started then (pid and
    start time) and it is writing to this very probe folder's log (``writes_probe_log``)."""
    notes = []
    probes = out_dir / "probes"
    for pid_file in sorted([*probes.glob(f"*/{PID_FILE}"), *probes.glob(f"*/rank*/{PID_FILE}")]):  # every rank
        seen = _read_json(pid_file)
        pid, start = seen.get("pid"), seen.get("start")
        if isinstance(pid, int) and pid > 1 and pid != os.getpid() and start is not None \
                and process_start_ticks(pid) == start:
            if _kill_proven_probe(pid, start, pid_file.parent):
                notes.append(f"killed probe pid {pid} ({pid_file.parent.name}), left running by an earlier search")
            else:
                log.info("%s names pid %d, which is not a probe of %s: left alone", pid_file, pid, out_dir)
        pid_file.unlink(missing_ok=True)
    return notes


def _pidfd(pid: int) -> Optional[int]:
    """A handle on the process itself (``pidfd_open``): a signal sent through it never reaches a process that
    reused the pid after the checks."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone, or not Linux 5.3+: the pid is checked right before the signal instead
        return None


def _send_kill(pid: int, handle: Optional[int]) -> None:
    with contextlib.suppress(ProcessLookupError, OSError):
        if handle is not None:
            signal.pidfd_send_signal(handle, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)


def _descendants(pid: int) -> List[int]:
    """The processes ``pid`` started, and theirs (a probe's data loaders, its generation server's workers)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def _kill_proven_probe(pid: int, start: int, probe_dir: Path) -> bool:
    """Kill ``pid`` and the processes it started, only where it is still the process that started at ``start`` and
    holds ``probe_dir``'s log open for writing: checked through a handle on the process taken first, so the check and
    the kill are about the same process."""
    handle = _pidfd(pid)
    try:
        if process_start_ticks(pid) != start or not writes_probe_log(pid, probe_dir):
            return False
        family = [(child, _pidfd(child)) for child in _descendants(pid)]
        _send_kill(pid, handle)
        for child, child_handle in family:
            _send_kill(child, child_handle)
            if child_handle is not None:
                os.close(child_handle)
        return True
    finally:
        if handle is not None:
            os.close(handle)


def writes_probe_log(pid: int, probe_dir: Path) -> bool:
    """Whether process ``pid`` holds ``probe_dir``'s own log open: every probe writes its output there from its
    first line (``autofit.probe._worker.child_main``), and no process of another folder or another program does.
    The kernel names an open file by its real path, so a copy of the folder, or a link to it, is another file."""
    wanted = os.path.realpath(probe_dir / LOG_FILE)
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in descriptors:
        with contextlib.suppress(OSError, ValueError, IndexError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted and _open_for_writing(pid, fd):
                return True
    return False


def _open_for_writing(pid: int, fd: str) -> bool:
    """The descriptor was opened to write (a probe writes its log; a ``tail -f`` or an editor reading it does not)."""
    for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8) & 0o3 in (os.O_WRONLY, os.O_RDWR)
    return False
