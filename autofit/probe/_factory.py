"""How a trainer factory reaches a probe process.

By name ("package.module:function", the CLI's ``--factory`` and the built-in ``--algo`` factories): the probe
imports it. By value (any callable given to ``autofit.fit``): it is pickled with cloudpickle, the library Ray, Dask
and loky use for exactly this, so module functions, functions of a script run directly or fed on stdin,
``python -c``, closures, lambdas and notebook cells all work, with the globals they use. A factory that cannot
cross (it holds an open file, a lock, a tensor on a GPU) is refused before the first probe, with the reason.

The study that stores the probes is named by the factory's identity: its qualified name and a hash of its code,
not the module it was found in, so a script's factory resumes whether it ran as ``__main__`` or was imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import logging
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Tuple, Union

from autofit.core import ALGORITHMS, InputError

log = logging.getLogger(__name__)

LARGE_PAYLOAD_BYTES = 256 * 2**20  # each probe receives a copy: say so when a factory carries this much


class FactoryError(InputError):
    """The user's trainer factory cannot be used, or failed (CLI exit 2)."""


@dataclass(frozen=True)
class FactoryPayload:
    """What a probe process needs to get the factory: a name to import, or the pickled callable."""

    ref: Optional[str] = None
    pickled: Optional[bytes] = None
    identity: str = ""  # names the study; the built-in ones are named by their algorithm
    builtin: bool = False
    name: str = ""  # for messages
    # The files the pickled code came from, by function name: cloudpickle names them "<dynamic-code>" in the probe,
    # and a message must show the user's own file and line.
    files: Tuple[Tuple[str, str], ...] = ()

    def named_frames(self, frames: str) -> str:
        """Traceback lines with the pickled functions' files put back."""
        files = dict(self.files)

        def named(match: re.Match[str]) -> str:
            original = files.get(match.group(2))
            return f'File "{original}", line {match.group(1)}, in {match.group(2)}' if original else match.group(0)

        return re.sub(r'File "<dynamic-code>", line (\d+), in (\w+)', named, frames)

    def load(self) -> Callable:
        if self.pickled is not None:
            import cloudpickle

            try:
                return cloudpickle.loads(self.pickled)
            except Exception as exc:  # noqa: BLE001 - a module it needs is missing in the probe, say
                raise FactoryError(f"trainer factory {self.name} cannot be loaded in the probe: "
                                   f"{type(exc).__name__}: {exc}") from exc
        assert self.ref is not None  # a payload holds the one or the other
        return load_factory(self.ref)


def _code_digest(code: types.CodeType, digest) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, digest)
        else:
            digest.update(repr(const).encode())


def identity(factory: Callable) -> str:
    """Qualified name and a hash of the code: the same function wherever it was imported from. The hash takes in
    the source file the function was written in (the helpers it calls, the module's globals) and every file its
    code names that exists (a data file it loads: its size and modification time), so that editing any of them
    measures again."""
    name = getattr(factory, "__qualname__", type(factory).__qualname__)
    code = (getattr(factory, "__code__", None)
            or getattr(getattr(factory, "__call__", None), "__code__", None))  # noqa: B004 - reads __call__'s code
    if code is None:
        return name
    digest = hashlib.sha1()
    _code_digest(code, digest)
    _files_digest(code, digest)
    return f"{name}@{digest.hexdigest()[:12]}"


def _named_files(code: types.CodeType) -> Iterator[str]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _named_files(const)
        elif isinstance(const, str) and 0 < len(const) < 4096 and "\n" not in const and "\0" not in const:
            yield const


def _files_digest(code: types.CodeType, digest) -> None:
    """The factory's source file's content, and the size and modification time of each file its code names."""
    source = code.co_filename
    if source and not source.startswith("<"):
        with contextlib.suppress(OSError):
            digest.update(Path(source).read_bytes())
    for named in sorted(set(_named_files(code))):
        with contextlib.suppress(OSError, ValueError):
            if os.path.isfile(named):
                info = os.stat(named)
                digest.update(f"{named}:{info.st_size}:{info.st_mtime_ns}".encode())


def _pickle(factory: Callable, name: str) -> bytes:
    import cloudpickle

    class CheckedPickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type not in ("cpu", "meta"):
                raise FactoryError(f"trainer factory {name} cannot be sent to a probe process: it holds a tensor on "
                                   f"{obj.device} (a probe must build its model itself, on its own device)")
            return super().reducer_override(obj)

    buffer = io.BytesIO()
    try:
        CheckedPickler(buffer).dump(factory)
    except FactoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - open files, locks, sockets, generators ...
        raise FactoryError(f"trainer factory {name} cannot be sent to a probe process: {type(exc).__name__}: "
                           f"{exc} (build what it needs inside the function, or from module-level names)") from None
    data = buffer.getvalue()
    if len(data) > LARGE_PAYLOAD_BYTES:
        log.warning("trainer factory %s carries %.0f MiB to every probe (the data it closes over): load the data "
                    "inside the function to avoid the copies", name, len(data) / 2**20)
    return data


def prepare_factory(factory: Union[str, Callable]) -> FactoryPayload:
    """The payload for ``factory`` (a built-in algorithm's name, "module:function", or a callable); raises
    ``FactoryError`` when a fresh process could not get it."""
    if isinstance(factory, str):
        builtin = {unit.name: unit.factory for unit in ALGORITHMS.values()}
        if factory in builtin or factory in builtin.values():
            return FactoryPayload(ref=builtin.get(factory, factory), identity="", builtin=True, name=factory)
        if ":" not in factory:
            raise FactoryError(f"trainer factory '{factory}' is not of the form 'package.module:function'")
        return FactoryPayload(ref=factory, identity=identity(load_factory(factory)), name=f"'{factory}'")
    if not callable(factory):
        raise FactoryError(f"trainer factory {factory!r} is not callable: pass a function that builds the trainer "
                           "from a candidate")
    name = getattr(factory, "__qualname__", repr(factory))
    return FactoryPayload(pickled=_pickle(factory, name), identity=identity(factory), name=name,
                          files=_source_files(factory))


def _source_files(factory: Callable) -> Tuple[Tuple[str, str], ...]:
    """(function name, file) of the factory's code, the functions nested in it and the functions of the same file
    it names: what crosses to the probe by value."""
    code = (getattr(factory, "__code__", None)
            or getattr(getattr(factory, "__call__", None), "__code__", None))  # noqa: B004 - reads __call__'s code
    if code is None:
        return ()
    found: Dict[str, str] = {}

    def walk(current: types.CodeType) -> None:
        found.setdefault(current.co_name, current.co_filename)
        for const in current.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    walk(code)
    for value in (getattr(factory, "__globals__", None) or {}).values():
        helper = getattr(value, "__code__", None)
        if isinstance(helper, types.CodeType) and helper.co_filename == code.co_filename:
            walk(helper)
    return tuple(sorted((name, file) for name, file in found.items() if not file.startswith("<dynamic")))


def load_factory(ref: str) -> Callable:
    module_name, _, qualname = ref.partition(":")
    try:
        target = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise FactoryError(f"trainer factory '{ref}' cannot be imported: {exc}") from exc
    if not callable(target):
        raise FactoryError(f"trainer factory '{ref}' is not callable")
    return target
