"""The user's config file (``--config FILE``) read once, by autofit, in the search's process, with limits, before TRL
or the export sees it: a regular file, or a pipe's content (``--config <(cat sft.yaml)``, a ``/dev/fd`` path, read
once and handed on); at most ``MAX_BYTES``; YAML aliases expanding to at most ``MAX_VALUES`` values (a 621-byte
alias bomb ran TRL's parser for minutes and gigabytes); no key written twice in one mapping (TRL's parser keeps the
last, ruamel.yaml, which writes best.yaml back, refuses the file after every probe has run). A fifo with no writer
is waited on for ``PIPE_WAIT_S`` seconds, never forever. Each refusal is one line naming the file and the limit.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from typing import Any, Dict, List, Set

import yaml

from autofit.core import InputError, one_line

MAX_BYTES = 1 << 20  # a TRL config is a few KiB; a 20 MB one made writing best.yaml take minutes
MAX_VALUES = 100_000  # values (scalars, lists, mappings) the document holds once its aliases are expanded
PIPE_WAIT_S = 60.0  # a pipe or fifo that writes nothing, or never ends, for this long is refused
_MERGE = "tag:yaml.org,2002:merge"


def read_config_text(path: str) -> str:
    """The file's text, read once; ``InputError`` (one line naming ``path`` and the limit) for what is refused."""
    data = _read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"--config {path}: cannot be read ({type(exc).__name__}: {one_line(exc)}); a TRL config "
                         "file is UTF-8 text") from None
    check_yaml(path, text)
    return text


def _read_bytes(path: str) -> bytes:
    try:
        # non-blocking: opening a fifo that has no writer returns at once instead of waiting for one forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise InputError(f"--config {path}: cannot be read ({type(exc).__name__}: {one_line(exc)})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"--config {path}: cannot be read (it is a directory); give a YAML file")
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            return _limited(path, _read_all(fd, time.monotonic() + PIPE_WAIT_S, pipe=False))
        if stat.S_ISFIFO(mode):
            return _limited(path, _read_all(fd, time.monotonic() + PIPE_WAIT_S, pipe=True))
        raise InputError(f"--config {path}: cannot be read (it is a {_kind(mode)}, not a regular file or a pipe)")
    except OSError as exc:
        raise InputError(f"--config {path}: cannot be read ({type(exc).__name__}: {one_line(exc)})") from None
    finally:
        os.close(fd)


def _read_all(fd: int, deadline: float, pipe: bool) -> bytes:
    """Up to ``MAX_BYTES + 1`` bytes; a pipe is polled until its end, at most until ``deadline``."""
    chunks: List[bytes] = []
    size = 0
    while size <= MAX_BYTES:
        if pipe:
            left = deadline - time.monotonic()
            # a fifo no writer has opened yet is not readable (Linux reports no hang-up before a first writer)
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(errno.ETIMEDOUT, f"nothing ended the pipe in {PIPE_WAIT_S:.0f} s "
                                                    "(a fifo with no writer?)")
        try:
            chunk = os.read(fd, MAX_BYTES + 1 - size)
        except BlockingIOError:
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _limited(path: str, data: bytes) -> bytes:
    if len(data) > MAX_BYTES:
        raise InputError(f"--config {path}: larger than {MAX_BYTES // 1024} KiB, the most autofit reads as a TRL "
                         "config file")
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def check_yaml(path: str, text: str) -> None:
    """The document's structure, before anything builds its values: at most ``MAX_VALUES`` values once aliases are
    expanded, no alias inside itself, no key twice in one mapping."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # nodes only: an alias is the node it names, not a copy
    except yaml.YAMLError:
        return  # TRL's parser gives its own message for a file YAML cannot read
    except RecursionError:
        raise InputError(f"--config {path}: nested deeper than a YAML parser can read") from None
    if root is None:
        return
    counts: Dict[int, int] = {}
    open_nodes: Set[int] = set()
    try:
        total = _values(root, counts, open_nodes, path)
    except RecursionError:
        raise InputError(f"--config {path}: nested deeper than a YAML parser can read") from None
    if total > MAX_VALUES:
        raise InputError(f"--config {path}: its YAML aliases expand to {total:,} values, more than the "
                         f"{MAX_VALUES:,} autofit reads (an alias bomb?)")
    _no_duplicate_keys(path, text)
    _writable_back(path, text)


def _values(node: yaml.Node, counts: Dict[int, int], open_nodes: Set[int], path: str) -> int:
    """How many values ``node`` holds with every alias expanded (each shared node counted once per use)."""
    if id(node) in counts:
        return counts[id(node)]
    if id(node) in open_nodes:
        raise InputError(f"--config {path}: a YAML alias refers to the value that holds it (a recursive alias)")
    open_nodes.add(id(node))
    total = 1
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            total += _values(item, counts, open_nodes, path)
            if total > MAX_VALUES:
                break
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            total += _values(key, counts, open_nodes, path) + _values(value, counts, open_nodes, path)
            if total > MAX_VALUES:
                break
    open_nodes.discard(id(node))
    counts[id(node)] = total
    return total


class _DuplicateChecking(yaml.SafeLoader):
    """PyYAML's safe loader (what TRL reads the file with) that refuses a key written twice in one mapping (a merge
    key's values, ``<<: *defaults``, may be overridden: that is what merging is)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: Set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: YAML's own error says so
                    continue
                if duplicate:
                    mark = key_node.start_mark
                    raise InputError(f"{key!s} is written twice (again on line {mark.line + 1}); TRL would keep "
                                     "the last, and autofit could not write best.yaml back: keep one")
        return super().construct_mapping(node, deep=deep)


def _no_duplicate_keys(path: str, text: str) -> None:
    try:
        yaml.load(text, Loader=_DuplicateChecking)  # noqa: S506 (a safe loader)
    except InputError as exc:
        raise InputError(f"--config {path}: the key {one_line(exc)}") from None
    except (yaml.YAMLError, RecursionError, ValueError, TypeError):
        return  # TRL's parser gives its own message


def _writable_back(path: str, text: str) -> None:
    """best.yaml is the user's file edited by ruamel.yaml's round-trip loader, which refuses some files TRL's parser
    reads (two merge keys in one mapping): refused before any probe, not after all of them."""
    import warnings

    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError, YAMLFutureWarning

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", YAMLFutureWarning)
            YAML().load(text)
    except YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise InputError(f"--config {path}: ruamel.yaml, which writes best.yaml back as your file, cannot read it: "
                         f"{one_line(problem)}{where}") from None
    except (RecursionError, ValueError, TypeError):
        return
