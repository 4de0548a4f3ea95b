"""autofit: find the best TRL training configuration that fits your GPU, by measuring it.

The public API is what this module exports (``__all__``): ``fit`` and what it returns or raises, the ``Candidate`` a
trainer factory receives, the ``Record`` a callback receives, the rung protocol for custom rungs (``Rung``,
``LadderState`` and the cost classes), and ``probe_kit``, the pieces the built-in factories use. Everything else is
internal. The names load on first use: ``import autofit`` and the command line's answers to bad input import no
torch.
"""

from importlib import import_module
from typing import Any, Dict, Tuple

__version__ = "0.1.0"

_EXPORTS: Dict[str, Tuple[str, str]] = {
    "fit": ("autofit._api", "fit"),
    "FitResult": ("autofit._api", "FitResult"),
    "NoFitError": ("autofit._api", "NoFitError"),
    "InputError": ("autofit.core", "InputError"),
    "FactoryError": ("autofit.probe", "FactoryError"),
    "InfrastructureError": ("autofit.search", "InfrastructureError"),
    "Candidate": ("autofit.core", "Candidate"),
    "Record": ("autofit.search", "Record"),
    "Rung": ("autofit.rungs", "Rung"),
    "LadderState": ("autofit.rungs", "LadderState"),
    "FREE": ("autofit.rungs", "FREE"),
    "SPEED": ("autofit.rungs", "SPEED"),
    "QUALITY": ("autofit.rungs", "QUALITY"),
    "probe_kit": ("autofit.probe.kit", ""),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'autofit' has no attribute '{name}'")
    module, attribute = _EXPORTS[name]
    found = import_module(module)
    return getattr(found, attribute) if attribute else found


def __dir__() -> list:
    return sorted(__all__)
