"""Trainer factories cross the process boundary by name ("package.module:function"), never by value."""

from __future__ import annotations

import importlib
from typing import Callable, Union

from autofit.algos import FACTORIES
from autofit.spec import InputError


class FactoryError(InputError):
    pass


def factory_ref(factory: Union[str, Callable]) -> str:
    """The importable name of ``factory``; raises ``FactoryError`` when a fresh process could not import it."""
    if isinstance(factory, str):
        ref = FACTORIES.get(factory, factory)
    else:
        module = getattr(factory, "__module__", None)
        qualname = getattr(factory, "__qualname__", None)
        if not module or not qualname or "<" in qualname:
            raise FactoryError(
                f"trainer factory {factory!r} is not importable: define it at module level "
                "(not a lambda or a nested function) so a fresh probe process can import it"
            )
        ref = f"{module}:{qualname}"
    if ":" not in ref:
        raise FactoryError(f"trainer factory '{ref}' is not of the form 'package.module:function'")
    if not ref.startswith("__main__:"):
        load_factory(ref)  # fail now, in the caller, rather than in every probe
    return ref


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
