"""The benchmark page's generated tables: each benchmark prints its table and, with ``--write FILE``, puts it
between its ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` markers (appended with them when they are absent)."""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Callable


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + begin + "\n" + body + "\n" + end + rest.split(end, 1)[1]
    return text.rstrip("\n") + f"\n\n{begin}\n{body}\n{end}\n"


def table_main(description: str, marker: str, table: Callable[[Path], str], log_level: int = logging.WARNING) -> None:
    """The command line of a benchmark whose result is one table, measured in a temporary folder."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", help=f"replace the {marker} table in this markdown file")
    args = parser.parse_args()
    logging.basicConfig(level=log_level)
    with tempfile.TemporaryDirectory(prefix=f"autofit-{marker}-") as folder:
        body = table(Path(folder))
    print(body)
    if args.write:
        path = Path(args.write)
        path.write_text(replace_between(path.read_text(), f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->", body))
