"""Imported once by the probe forkserver (see ``runner``): heavy imports shared by every probe process."""

from autofit.runner import preload_modules

preload_modules()
