"""autofit: find the best TRL training configuration that fits your GPU, by measuring it."""

__version__ = "0.1.0"

__all__ = ["fit", "Candidate", "FitResult", "NoFitError", "__version__"]


def __getattr__(name):
    # Lazy: the CLI must answer bad input without importing torch.
    if name in ("fit", "FitResult", "NoFitError"):
        from autofit import api

        return getattr(api, name)
    if name == "Candidate":
        from autofit.candidate import Candidate

        return Candidate
    raise AttributeError(name)
