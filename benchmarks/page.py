"""The benchmark page's generated tables: each benchmark prints its table and, with ``--write FILE``, puts it
between its ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` markers (appended with them when they are absent).

``--quick`` (``make bench-... QUICK=1``, ``make bench-quick``, run by ``make test``) measures one small workload of
each benchmark in seconds, so that none of them can break unseen; its table never goes into the page."""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable, List, Sequence, TypeVar

QUICK_ENV = "AUTOFIT_BENCH_QUICK"
T = TypeVar("T")


def quick() -> bool:
    """Whether this run is the quick one (``--quick``): one small workload per benchmark."""
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def chosen(items: Sequence[T], count: int = 1) -> List[T]:
    """The workloads to measure: all of them, or the first ``count`` in the quick run."""
    return list(items[:count] if quick() else items)


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]
    return text.rstrip("\n") + f"\n\n{begin}\n{body}\n{end}\n"


def table_main(description: str, marker: str, table: Callable[[Path], str], log_level: int = logging.WARNING) -> None:
    """The command line of a benchmark whose result is one table, measured in a temporary folder."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", help=f"replace the {marker} table in this markdown file")
    parser.add_argument("--quick", action="store_true", help="one small workload, to see that it runs (CI); its "
                        "table is printed, never written")
    args = parser.parse_args()
    if args.quick:
        if args.write:
            parser.error("--quick measures one small workload: its table is not the page's (drop --write)")
        os.environ[QUICK_ENV] = "1"
    logging.basicConfig(level=log_level)
    with tempfile.TemporaryDirectory(prefix=f"autofit-{marker}-") as folder:
        body = table(Path(folder))
    print(body)
    if args.write:
        path = Path(args.write)
        path.write_text(replace_between(path.read_text(), f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->", body))
