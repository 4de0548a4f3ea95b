"""``autofit worker --study DIR_OR_URL``: take the probes of searches run with ``--workers N`` and run them on this
machine's GPUs (``autofit.workers.serve``). Exit codes: 0 the searches it served have ended, 2 bad input (a queue
that cannot be reached, a bad device list), 130 interrupted (the probe it ran is handed out again)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Optional

from autofit.cli._signals import exit_code, terminate_as_interrupt
from autofit.core import FIELDS, InputError, one_line

DEFAULT_WORKDIR = "autofit-worker"


def add_parser(commands: Any) -> None:
    worker = commands.add_parser(
        "worker", help="run the probes a search hands out (autofit search --workers N) on this machine's GPUs",
        description="Take the probes of searches started with --workers N from a queue they share (their "
                    "--worker-queue) and run each on this machine's GPUs, one at a time, until those searches end. "
                    "Start one per GPU (or per --gpus of the search), e.g. under srun.")
    worker.add_argument("--study", required=True, metavar="DIR_OR_URL",
                        help="the searches' queue: the --out folder of a search (or its --worker-queue folder) on a "
                             "shared filesystem, redis://HOST:PORT, or postgresql://USER@HOST/DB, the password in "
                             "$AUTOFIT_QUEUE_PASSWORD or the file $AUTOFIT_QUEUE_PASSWORD_FILE; jobs must be signed "
                             "with the searches' key ($AUTOFIT_QUEUE_KEY, else ~/.config/autofit/queue.key)")
    worker.add_argument("--gpus-for-probes", metavar="IDS",
                        help="the GPUs this worker's probes see, e.g. 0 or 0,1 (default: every GPU visible to it)")
    worker.add_argument("--workdir", default=DEFAULT_WORKDIR, metavar="DIR",
                        help=f"where the probes' folders and logs go (default {DEFAULT_WORKDIR})")
    worker.add_argument("--idle-exit", metavar="S",
                        help="leave after S seconds without a probe (default: stay until the searches it served end)")
    worker.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")


def _read(field: str, flag: str, text: Optional[str]) -> Any:
    """``text`` read as the search's option ``field`` reads its own (the worker's flags accept what the search's do)."""
    if text is None:
        return None
    kind = FIELDS[field].metadata["kind"]
    try:
        value = kind.parse(text) if kind.parse else text
    except (TypeError, ValueError):
        value = None
    if value is None or not kind.accepts(value):
        raise InputError(f"{flag} {text!r}: {kind.phrase}")
    return value


def run(args: argparse.Namespace) -> int:
    from autofit.workers import serve

    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
    terminate_as_interrupt()
    try:
        devices = _read("gpus_for_probes", "--gpus-for-probes", args.gpus_for_probes)
        idle_exit = _read("worker_silence_s", "--idle-exit", args.idle_exit)
        served = serve(args.study, Path(args.workdir), [str(d) for d in devices] if devices else None,
                       idle_exit_s=idle_exit)
    except InputError as exc:
        print(f"autofit: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("autofit: worker interrupted; the probe it ran (if any) is handed back to its search", file=sys.stderr)
        return exit_code(exc)
    print(f"autofit worker: {served} probe(s) run")
    return 0
