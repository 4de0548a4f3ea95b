"""Which models autofit knows, offline.

A model is named by a hub id or a local path. Probing needs only its configuration: common models ship with
autofit (``autofit/models/*.json``); a local folder needs a ``config.json``. Nothing is downloaded here.
This module imports neither torch nor transformers, so input errors are reported at once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

BUNDLED_DIR = Path(__file__).parent / "models"


class UnknownModelError(ValueError):
    pass


@dataclass(frozen=True)
class ModelSource:
    name: str  # what the user typed
    config: Dict  # the configuration, model_type included
    local_path: Optional[str] = None  # a folder with config.json (and maybe weights)

    @property
    def model_type(self) -> str:
        return self.config["model_type"]


def bundled_names() -> List[str]:
    return sorted(p.stem.replace("--", "/") for p in BUNDLED_DIR.glob("*.json"))


def resolve_model(name: str) -> ModelSource:
    """Find the configuration of ``name`` without touching the network."""
    bundled = BUNDLED_DIR / (name.replace("/", "--") + ".json")
    if bundled.is_file():
        return ModelSource(name, json.loads(bundled.read_text()))
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise UnknownModelError(f"model folder '{name}' has no config.json")
        return ModelSource(name, json.loads(config.read_text()), local_path=str(path.resolve()))
    cached = _hub_cache_config(name)
    if cached is not None:
        return ModelSource(name, json.loads(cached.read_text()))
    raise UnknownModelError(
        f"unknown model '{name}': not bundled ({', '.join(bundled_names())}), "
        "not a local folder with config.json, and not in the Hugging Face cache"
    )


def _hub_cache_config(name: str) -> Optional[Path]:
    """config.json of ``name`` if an earlier download left it in the Hugging Face hub cache."""
    if name.count("/") != 1:
        return None
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = hub.expanduser() / ("models--" + name.replace("/", "--")) / "snapshots"
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    return found[-1] if found else None
