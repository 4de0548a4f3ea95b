"""autofit: find the best TRL training configuration that fits your GPU, by measuring it."""

__version__ = "0.1.0"

__all__ = ["fit", "Candidate", "FitResult", "NoFitError", "InfrastructureError", "FactoryError", "__version__"]


def __getattr__(name):
    # Lazy: the CLI must answer bad input without importing torch.
    if name in ("fit", "FitResult", "NoFitError"):
        from autofit import _api as api

        return getattr(api, name)
    if name == "InfrastructureError":
        from autofit.search import InfrastructureError

        return InfrastructureError
    if name == "FactoryError":
        from autofit.probe import FactoryError

        return FactoryError
    if name == "Candidate":
        from autofit.core import Candidate

        return Candidate
    raise AttributeError(name)
