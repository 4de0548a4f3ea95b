"""What the search shows while a probe runs: on a terminal, one live line (the probe, its predicted peak against the
budget, the phase its process is in, how long it has run and about how long it has left) that gives way to the
probe's log line when it ends; elsewhere (a pipe, a log file, CI) a line when a probe starts; with ``-q`` nothing beyond
the log lines.

The phase is what the probe process writes to its folder (``autofit.probe._instrument.PhaseFile``); the time left is the
mean wall time of the probes of the same kind that ran in this search (stored results reused cost no time and do
not count), and is not shown before one has finished.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, TextIO, Tuple, TypeVar, cast

from rich.cells import cell_len
from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from autofit.core import Candidate, format_size, one_line
from autofit.machine import PHASE_FILE

T = TypeVar("T")
log = logging.getLogger(__name__)

PHASE_LABELS = {"forward_backward": "forward/backward"}


class ProbeProgress:
    """The interface the search and the runner talk to; this one shows nothing."""

    def start(self, index: int, level: int, kind: str, candidate: Candidate, predicted_bytes: Optional[float],
              budget_bytes: Optional[int]) -> None:
        """A probe (``kind`` "probe" or "verify", the ``index``-th of the search's records) is about to run."""

    def poll(self, probe_dir: Path) -> None:
        """Called now and then while the probe process runs; ``probe_dir`` holds its phase file."""

    def finish(self) -> None:
        """The probe ended: clear the display before its log line is written."""

    def close(self) -> None:
        """The search ended (or was interrupted)."""

    def around(self, run: Callable[[], T], index: int, level: int, kind: str, candidate: Candidate,
               predicted_bytes: Optional[float], budget_bytes: Optional[int]) -> Callable[[], T]:
        """``run``, shown while it runs."""

        def shown() -> T:
            self.start(index, level, kind, candidate, predicted_bytes, budget_bytes)
            try:
                return run()
            finally:
                self.finish()

        return shown


class PlainProgress(ProbeProgress):
    """Quiet: the probes' log lines are all there is."""


class LineProgress(ProbeProgress):
    """Not a terminal (a pipe, a log file, CI): a line when each probe starts, so minutes between two probe lines
    are not silence. A probe the search runs once more (the machine failed it) starts "again", under its number."""

    def __init__(self) -> None:
        self.last: Optional[Tuple[int, str, str]] = None  # (index, kind, candidate's key) of the last one started

    def start(self, index: int, level: int, kind: str, candidate: Candidate, predicted_bytes: Optional[float],
              budget_bytes: Optional[int]) -> None:
        again = self.last == (index, kind, candidate.key())
        self.last = (index, kind, candidate.key())
        log.info("%s %-5d [%s] %s: started%s%s", kind, index, "+".join(candidate.rungs) or "baseline",
                 candidate.describe(), " again" if again else "", _memory(predicted_bytes, budget_bytes, prefix=", "))


def _memory(predicted_bytes: Optional[float], budget_bytes: Optional[int], prefix: str = "") -> str:
    budget = format_size(budget_bytes) if budget_bytes is not None else None
    if predicted_bytes is not None:
        return prefix + f"predicted {format_size(predicted_bytes)}" + (f" of {budget}" if budget else "")
    return prefix + f"budget {budget}" if budget else ""


def make_progress(quiet: bool = False, stream: Optional[TextIO] = None) -> ProbeProgress:
    """The live display when ``stream`` (default stderr) is a terminal that can draw it and not ``quiet``."""
    stream = stream if stream is not None else sys.stderr
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        terminal = False
    if quiet:
        return PlainProgress()
    if not terminal or os.environ.get("TERM") == "dumb":
        return LineProgress()
    return LiveProgress(Console(file=stream))


def clock_text(seconds: float) -> str:
    """M:SS, or H:MM:SS from an hour on."""
    minutes, secs = divmod(int(max(seconds, 0)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class LiveProgress(ProbeProgress):
    """One transient line on ``console`` (more on a narrow terminal), redrawn twice a second while a probe runs."""

    def __init__(self, console: Console, clock: Callable[[], float] = time.monotonic):
        self.console = console
        self.clock = clock
        self.began = clock()
        self.durations: Dict[str, List[float]] = {}  # wall seconds of the probes run, by kind
        self.what: List[str] = []
        self.kind = "probe"
        self.started: Optional[float] = None
        self.phase: Optional[str] = None
        self.shown = ""  # the key of the candidate shown (``Candidate.key``): its probe's folder begins with it
        self._spinner = Spinner("dots")
        self._live: Optional[Live] = None
        self._rerouted: List = []

    def start(self, index: int, level: int, kind: str, candidate: Candidate, predicted_bytes: Optional[float],
              budget_bytes: Optional[int]) -> None:
        self.finish()
        memory = _memory(predicted_bytes, budget_bytes)
        self.what = [part for part in (
            f"{kind} {index} [{'+'.join(candidate.rungs) or 'baseline'}] {candidate.describe()}", memory) if part]
        self.kind, self.phase, self.started = kind, None, self.clock()
        self.shown = candidate.key()
        self._live = Live(console=self.console, get_renderable=self._render, refresh_per_second=2, transient=True,
                          redirect_stdout=False, redirect_stderr=True)
        self._live.start(refresh=True)
        self._reroute_logging(sys.stderr)

    def poll(self, probe_dir: Path) -> None:
        if not Path(probe_dir).name.startswith(f"{self.shown}-"):  # a probe started ahead, beside the one shown
            return
        try:
            phase = one_line((Path(probe_dir) / PHASE_FILE).read_text(errors="replace").strip())[:40]
        except OSError:  # not written yet (or not at all): the last phase read stays
            return
        if phase and phase != self.phase:
            self.phase = phase
            if self._live is not None:
                self._live.refresh()

    def finish(self) -> None:
        if self._live is None:
            return
        self._reroute_logging(None)
        self._live.stop()
        self._live = None
        assert self.started is not None  # set where the line was shown
        self.durations.setdefault(self.kind, []).append(self.clock() - self.started)

    def close(self) -> None:
        self.finish()

    def line(self) -> str:
        """What the display says now (without the spinner)."""
        return " · ".join(self.parts())

    def parts(self) -> List[str]:
        now = self.clock()
        elapsed = now - (self.started if self.started is not None else now)
        parts = list(self.what)
        if self.phase:
            parts.append(PHASE_LABELS.get(self.phase, self.phase.replace("_", " ")))
        timing = clock_text(elapsed)
        done = self.durations.get(self.kind, [])
        if done:
            noun = "verification" if self.kind == "verify" else self.kind
            mean, runs = sum(done) / len(done), f"{len(done)} {noun}{'s' if len(done) > 1 else ''}"
            timing += (f" · ~{clock_text(mean - elapsed)} left (mean of {runs})" if elapsed < mean
                       else f" · longer than the mean of {runs} ({clock_text(mean)})")
        parts += [timing, f"search {clock_text(now - self.began)}"]
        return parts

    def _render(self) -> Text:
        """The spinner and the line; on a narrow terminal, more lines broken between parts, not inside one."""
        width, lines = max(self.console.width - 2, 20), [""]
        for part in self.parts():
            joined = f"{lines[-1]} · {part}" if lines[-1] else part
            if lines[-1] and cell_len(joined) > width:
                lines.append(part)
            else:
                lines[-1] = joined
        frame = cast(Text, self._spinner.render(self.console.get_time()))  # a Text: the spinner has no text of its own
        return Text.assemble(frame, " ", "\n  ".join(lines), no_wrap=True, overflow="ellipsis")

    def _reroute_logging(self, stream: Optional[TextIO]) -> None:
        """While the line is shown, log handlers that write to the same stream write above it instead (through the
        proxy rich puts in place of ``sys.stderr``), or a warning would be drawn over; ``None`` puts them back."""
        for handler, previous in self._rerouted:
            handler.setStream(previous)
        self._rerouted = []
        if stream is None or stream is self.console.file:
            return
        for logger in (logging.getLogger(), logging.getLogger("autofit")):
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler and handler.stream is self.console.file:
                    self._rerouted.append((handler, handler.setStream(stream)))
