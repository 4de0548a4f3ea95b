"""Differences between the library versions autofit supports, answered without importing them (the search's own
process never imports torch or transformers; the installed versions are read from package metadata)."""

from __future__ import annotations

import importlib.util
from functools import cache
from importlib import metadata
from typing import Dict, Iterable, Optional

from packaging.version import InvalidVersion, Version

# transformers 5.23 renamed TrainingArguments.gradient_checkpointing to activation_checkpointing (the old name stays
# as a deprecated alias there, and setting only it through dataclasses.replace silently keeps checkpointing on);
# before 5.23 only gradient_checkpointing exists (the GPU image's transformers 5.17, the declared floor 4.56).
ACTIVATION_CHECKPOINTING_SINCE = Version("5.23.0")


@cache
def installed(package: str) -> Optional[Version]:
    try:
        return Version(metadata.version(package))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None


def installed_versions(packages: Iterable[str]) -> Dict[str, Optional[str]]:
    """Each package's installed version as its metadata says it, None where it is not installed."""
    found: Dict[str, Optional[str]] = {}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def checkpointing_field() -> str:
    """The training-arguments field that turns activation (gradient) checkpointing on or off."""
    version = installed("transformers")
    if version is not None and version < ACTIVATION_CHECKPOINTING_SINCE:
        return "gradient_checkpointing"
    return "activation_checkpointing"


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None
