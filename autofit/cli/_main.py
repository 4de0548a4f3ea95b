"""``autofit search``: the command line, and ``autofit search|estimate [options] -- <your launch>`` (the launch after
``--`` is read by ``autofit.launch._command`` before argparse sees the line). The exit codes are ``_exit``'s; with
``--json`` every way a search ends, a refused command line included, is also one JSON document on stdout
(``_search_json``)."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from autofit import __version__
from autofit.cli._exit import EXIT_BAD_INPUT, EXIT_NO_FIT, EXIT_OK, EXIT_PROBES_CANNOT_RUN, exit_codes_help
from autofit.cli._signals import exit_code, terminate_as_interrupt
from autofit.core import FIELDS, SEARCH, SearchOptions, add_options, given_values

EXIT_CODES = exit_codes_help()

log = logging.getLogger("autofit")


class _LadderHelp(argparse.HelpFormatter):
    """--ladder's help names the rungs accepted here, installed packages' included: read when the help is drawn."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action) or ""
        if "--ladder" in action.option_strings:
            from autofit.rungs import accepted_names

            text += "; accepted: " + ", ".join(accepted_names()).replace("%", "%%")
        return text


class _SearchHelp(_LadderHelp, argparse.RawDescriptionHelpFormatter):
    pass


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _LadderHelp)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line, not the usage block
        line = f"{message} (see {self.prog} --help)"
        sys.stderr.write(f"autofit: error: {line}\n")
        raise UsageError(line)


class UsageError(SystemExit):
    """A command line argparse refused (exit 2), its one line kept for the --json document."""

    def __init__(self, line: str):
        super().__init__(EXIT_BAD_INPUT)
        self.line = line


def build_parser() -> argparse.ArgumentParser:
    """``autofit search``, ``estimate``, ``report`` and ``worker``; the first two take their options from
    ``SearchOptions``."""
    from autofit.cli import _estimate as estimate
    from autofit.cli import _skills as skills
    from autofit.cli import _worker as worker

    parser = _Parser(prog="autofit", description="Find the best TRL training configuration that fits your GPU.",
                     epilog="autofit search|estimate [options] -- <your launch>: the command you run (trl sft --config "
                            "F.yaml ..., accelerate launch [...] trl sft --config F.yaml ...), read as TRL and "
                            "accelerate read it; the options before -- override it (docs/cli.md)")
    parser.add_argument("--version", action="version", version=f"autofit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    search = commands.add_parser("search", help="probe real training runs and write the best config that fits",
                                 epilog=EXIT_CODES, formatter_class=_SearchHelp)
    add_options(search, SEARCH)
    estimate.add_parser(commands)
    report = commands.add_parser("report", help="draw DIR/report.html again from a search's best.json and study",
                                 description="Render report.html from the best.json and the Optuna study that "
                                             "`autofit search --out DIR` left in DIR.")
    report.add_argument("out_dir", metavar="DIR", help="the --out folder of a search")
    worker.add_parser(commands)
    skills.add_parser(commands)
    return parser


# A write the disk refused, whatever the file: what to do about it (the same command then resumes).
_WRITE_ERRNOS = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some of your disk quota",
                 errno.EFBIG: "raise the file size limit (ulimit -f)", errno.EROFS: "make that filesystem writable",
                 errno.EIO: "check that disk"}
# Refusals that are a write failure when they name a file autofit writes under --out.
_OUT_ERRNOS = {errno.EACCES: "make it writable", errno.EPERM: "make it writable"}


def write_failure(exc: OSError, out_dir: Path) -> Optional[str]:
    """The one line for a write of the study or the outputs that failed (a full disk, ``ulimit -f``, a quota, a
    filesystem turned read-only), naming the file; None for an OSError of another kind."""
    advice = _WRITE_ERRNOS.get(exc.errno or 0)
    if advice is None and exc.filename is not None and exc.errno in _OUT_ERRNOS:
        try:
            inside = Path(str(exc.filename)).resolve().is_relative_to(out_dir.resolve())
        except (OSError, ValueError):
            inside = False
        advice = _OUT_ERRNOS[exc.errno] if inside else None
    if advice is None:
        return None
    return (f"{exc.strerror or os.strerror(exc.errno or 0)} writing {exc.filename or out_dir}: {advice} and run the "
            "same command again")


def report_command(args) -> int:
    from autofit.core import InputError, one_line
    from autofit.report import write

    try:
        path = write(Path(args.out_dir))
    except InputError as exc:
        print(f"autofit: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        line = write_failure(exc, Path(args.out_dir))
        if line is None:
            raise
        print(f"autofit: error: {line}", file=sys.stderr)
        return EXIT_PROBES_CANNOT_RUN
    print(f"wrote {path}")
    return EXIT_OK


def _launch(args: argparse.Namespace, launch: Optional[List[str]]) -> Optional[str]:
    """Read the launch after ``--`` into ``args.launch`` (the options it sets); the one-line refusal, or None."""
    from autofit.core import InputError, one_line
    from autofit.launch import read_command

    args.launch = {}
    if launch is None:
        return None
    if args.command not in ("search", "estimate"):
        return f"autofit {args.command} takes no launch after --"
    try:
        args.launch = read_command(launch)
    except InputError as exc:
        return one_line(exc)
    for key, flag, theirs_named in (("config", "--config", "--config"),
                                    ("accelerate_config", "--accelerate-config", "accelerate config")):
        door, theirs = getattr(args, key, None), args.launch.get(key)
        if door and theirs and not _same_file(str(door), str(theirs)):
            return (f"{flag} {one_line(door)} and the launch's {theirs_named} {one_line(theirs)} differ: give one, in "
                    f"the launch after -- or as {flag} before it")
    return None


def _same_file(one: str, other: str) -> bool:
    try:
        return os.path.samefile(one, other)
    except OSError:  # one is not there (a name of TRL's, or a file the reading will refuse): as written
        return os.path.normpath(one) == os.path.normpath(other)


def main(argv: Optional[List[str]] = None) -> int:
    from autofit.launch import split_launch

    words = sys.argv[1:] if argv is None else argv
    own, launch = split_launch(words)
    try:
        args = build_parser().parse_args(own)
    except UsageError as exc:  # --json asked: the refusal is a document too
        if own[:1] in (["search"], ["estimate"]) and "--json" in own:
            print(refusal_json(own[0], exc.line, words, launch))
        raise
    refused = _launch(args, launch)
    if refused:
        print(f"autofit: error: {refused}", file=sys.stderr)
        if getattr(args, "as_json", False):
            print(refusal_json(args.command, refused, words, launch))
        return EXIT_BAD_INPUT
    if args.command == "estimate":
        from autofit.cli import _estimate as estimate

        return estimate.run(args)
    if args.command == "report":
        return report_command(args)
    if args.command == "worker":
        from autofit.cli import _worker as worker

        return worker.run(args)
    if args.command == "skills":
        from autofit.cli import _skills as skills

        return skills.run(args)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
    if not args.as_json:
        return search(args).code
    from autofit.cli._search_json import search_json, stdout_to_stderr

    with stdout_to_stderr():
        ended = search(args)
    print(search_json(ended.code, ended.message, words, ended.out_dir, ended.spec, ended.report, launch))
    return ended.code


def refusal_json(command: str, line: str, argv: List[str], launch: Optional[List[str]]) -> str:
    """The document of a command refused before it ran: its ``exit`` block, with nothing measured or estimated."""
    if command == "estimate":
        from autofit.cli._estimate_json import refused_json

        return refused_json(line)
    from autofit.cli._search_json import search_json

    return search_json(EXIT_BAD_INPUT, line, argv, Path(str(FIELDS["out_dir"].default)), launch=launch)


@dataclass
class Ended:
    """How a search ended: the exit code, the line printed on stderr, and what it had resolved and found by then."""

    code: int
    out_dir: Path
    message: Optional[str] = None
    spec: Any = None
    report: Any = None


def search(args: argparse.Namespace) -> Ended:
    """Run ``autofit search``: the progress on stderr, the table and the answer on stdout (on stderr under --json,
    where stdout is the document's)."""
    from autofit._api import no_fit_message, run_search
    from autofit.core import InputError, one_line
    from autofit.export import summary_lines, table_text
    from autofit.launch import at_door
    from autofit.machine import UnknownModelError
    from autofit.probe import FactoryError, prepare_factory
    from autofit.search import InfrastructureError, question

    out_dir = Path(str(args.out_dir or FIELDS["out_dir"].default))
    terminate_as_interrupt()
    spec = None

    def failed(code: int, line: str, what: str = "error: ") -> Ended:
        print(f"autofit: {what}{line}", file=sys.stderr)
        return Ended(code, out_dir, line, spec)

    try:
        values, read = at_door({**args.launch, **given_values(args, SEARCH)})
        options = SearchOptions(**values)
        out_dir = options.out_dir
        payload = prepare_factory(options.factory) if options.factory else None
        spec = question(options, factory=payload.identity if payload else None, launch=read)
        report = run_search(spec, factory=payload)
    except FactoryError as exc:  # several lines on purpose: the user's own frames
        return failed(EXIT_BAD_INPUT, str(exc))
    except (InputError, UnknownModelError) as exc:
        return failed(EXIT_BAD_INPUT, one_line(exc))
    except InfrastructureError as exc:
        return failed(EXIT_PROBES_CANNOT_RUN, one_line(exc))
    except KeyboardInterrupt as exc:
        return failed(exit_code(exc), f"interrupted; run the same command again to resume from {out_dir}", what="")
    except OSError as exc:
        line = write_failure(exc, out_dir)
        if line is None:
            raise
        return failed(EXIT_PROBES_CANNOT_RUN, f"{line}; it resumes from {out_dir}")
    out = sys.stderr if args.as_json else sys.stdout
    print(table_text(report), file=out)
    for note in report.notes:
        print(f"note: {note}", file=out)
    if not report.fits:
        message = no_fit_message(report)
        print(f"autofit: {message}", file=sys.stderr)
        print(f"details: {spec.options.out_dir / 'best.json'}", file=out)
        if (spec.options.out_dir / "report.html").exists():
            print(f"report: {spec.options.out_dir / 'report.html'}", file=out)
        return Ended(EXIT_NO_FIT, out_dir, message, spec, report)
    for line in summary_lines(report):
        print(line, file=out)
    return Ended(EXIT_OK, out_dir, None, spec, report)


if __name__ == "__main__":
    sys.exit(main())
