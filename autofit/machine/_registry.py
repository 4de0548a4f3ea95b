"""Which models autofit knows, and where their configuration comes from.

A model is named by a hub id (``owner/name``) or a local path. Probing needs only its configuration, looked up in
this order: the configurations that ship with autofit (``autofit/models/*.json``), a local folder with a
``config.json``, a ``config.json`` already in the Hugging Face hub cache, and last the hub itself. From the hub only
``config.json`` is fetched (never weights), into the normal hub cache, so the next look-up is offline.

Every failure is an ``UnknownModelError`` whose message is one line: which case it is and what to do.
This module imports neither torch nor transformers, and huggingface_hub only when a configuration must be fetched,
so input errors are reported at once.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

log = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).parents[1] / "models"
CONFIG_FILE = "config.json"
LOGIN_HINT = (
    "(`hf auth login`, or `huggingface-cli login` before huggingface_hub 1.0) or set HF_TOKEN to one of its tokens"
)
# huggingface_hub's repo id rule, less ids without an owner ("gpt2"): only ``owner/name`` is fetched
_HUB_ID = re.compile(r"^\w(?:[\w.-]*\w)?/\w(?:[\w.-]*\w)?$")
_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # what huggingface_hub accepts as "true" in HF_HUB_OFFLINE
_JSON_TYPE_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
                    type(None): "null"}


class UnknownModelError(ValueError):
    pass


@dataclass(frozen=True)
class ModelSource:
    name: str  # what the user typed
    config: Dict[str, Any]  # the configuration, model_type included
    local_path: Optional[str] = None  # a folder with config.json (and maybe weights)

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])


def needs_own_code(config: Dict[str, Any]) -> Optional[str]:
    """The model_type of a config that brings its own code (``auto_map``) for a type the installed transformers does
    not know, else None. Most types are found as a module of transformers without importing anything heavy; only an
    ``auto_map`` config whose type is not is looked up in transformers' own table (which imports torch)."""
    import importlib.util

    if not config.get("auto_map"):
        return None
    model_type = str(config.get("model_type", ""))
    try:
        if model_type and importlib.util.find_spec(f"transformers.models.{model_type.replace('-', '_')}"):
            return None
    except (ImportError, ValueError):
        pass
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:  # no transformers to ask: the probes will say
        return None
    return None if model_type in CONFIG_MAPPING_NAMES else model_type


def bundled_names() -> List[str]:
    return sorted(p.stem.replace("--", "/") for p in BUNDLED_DIR.glob("*.json"))


def resolve_model(name: str) -> ModelSource:
    """Find the configuration of ``name``: bundled, a local folder, the hub cache, then the hub (config.json only)."""
    if name in bundled_names():  # by name: a long folder path is no file name to look up
        return ModelSource(name, load_config(BUNDLED_DIR / (name.replace("/", "--") + ".json"), name))
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        config = path / CONFIG_FILE
        if not config.is_file():
            raise UnknownModelError(f"model folder '{name}' has no config.json")
        return ModelSource(name, load_config(config, name), local_path=str(path.resolve()))
    if not looks_like_hub_id(name):
        raise UnknownModelError(
            f"unknown model '{name}': not bundled ({', '.join(bundled_names())}), not a local folder, "
            "and not a Hugging Face hub id (owner/name)"
        )
    config = _hub_cache_config(name) or fetch_hub_config(name)
    return ModelSource(name, load_config(config, name))


def looks_like_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and "--" not in name and ".." not in name


def load_config(path: Path, name: str) -> Dict[str, Any]:
    """The configuration in ``path``; a one-line UnknownModelError naming the file when it cannot be used."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UnknownModelError(
            f"model '{name}': {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UnknownModelError(f"model '{name}': cannot read {path}: {_one_line(exc)}") from exc
    except RecursionError:
        raise UnknownModelError(f"model '{name}': {path} is nested too deeply to be a configuration") from None
    if not isinstance(config, dict):
        kind = _JSON_TYPE_NAMES.get(type(config), type(config).__name__)
        raise UnknownModelError(f"model '{name}': {path} holds {kind}, not a JSON object with the configuration")
    if not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise UnknownModelError(
            f"model '{name}': {path} has no \"model_type\", so autofit cannot tell the model's architecture"
        )
    check_config_values(config, path, name)
    return config


# Sizes a configuration gives as a positive whole number (or leaves out, or null where transformers derives them).
SIZE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "head_dim", "vocab_size", "max_position_embeddings", "n_layer", "n_embd", "n_head", "n_positions")
_MODEL_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def check_config_values(config: Dict[str, Any], path: Path, name: str) -> None:
    """Refuse a configuration no model could be built from, naming the key: a size that is not a positive whole
    number (0 layers, a negative width, a string, NaN), or a model_type that is not a name (it becomes a module
    and a file name)."""
    model_type = config["model_type"]
    if not _MODEL_TYPE.fullmatch(model_type):
        raise UnknownModelError(f"model '{name}': {path} has model_type {json.dumps(model_type)[:80]}, not a model "
                                "type's name (letters, digits, '_' and '-')")
    nested = config.get("text_config")
    for where, values in (("", config), ("text_config.", nested if isinstance(nested, dict) else {})):
        for key in SIZE_KEYS:
            value = values.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UnknownModelError(f"model '{name}': {path} has {where}{key} = {json.dumps(value)[:40]}: a "
                                        "positive whole number is accepted")
        _check_heads(values, where, path, name)
        for key in ("torch_dtype", "dtype"):
            value = values.get(key)
            if value is not None and value not in DTYPE_NAMES:
                raise UnknownModelError(f"model '{name}': {path} has {where}{key} = {json.dumps(value)[:40]}: a "
                                        f"torch dtype's name is accepted ({', '.join(sorted(DTYPE_NAMES)[:6])}, ...)")


# The dtypes a configuration's torch_dtype/dtype may name (torch's own names, as transformers reads them).
DTYPE_NAMES = frozenset({"auto", "float32", "float", "float16", "half", "bfloat16", "float64", "double", "int8",
                         "uint8", "float8_e4m3fn", "float8_e5m2", "complex64"})


def _check_heads(values: Dict[str, Any], where: str, path: Path, name: str) -> None:
    """Attention heads that no model of the configuration can have: a hidden size the heads do not divide (where
    head_dim does not say the width of a head), more key-value heads than heads, or heads they do not divide."""
    hidden, heads = values.get("hidden_size", values.get("n_embd")), values.get("num_attention_heads",
                                                                              values.get("n_head"))
    kv_heads = values.get("num_key_value_heads")
    heads_key = "num_attention_heads" if "num_attention_heads" in values else "n_head"
    if isinstance(hidden, int) and isinstance(heads, int) and values.get("head_dim") is None and hidden % heads:
        raise UnknownModelError(f"model '{name}': {path} has {where}{heads_key} = {heads}, which does not divide "
                                f"{where}hidden_size = {hidden}: each head is hidden_size / {heads_key} wide")
    if isinstance(heads, int) and isinstance(kv_heads, int) and (kv_heads > heads or heads % kv_heads):
        raise UnknownModelError(f"model '{name}': {path} has {where}num_key_value_heads = {kv_heads} for "
                                f"{where}{heads_key} = {heads}: key-value heads must divide the heads, at most as many")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, found as huggingface_hub finds it, but from the environment of this call."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return _expand(explicit)
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return _expand(home) / "hub"


def _hub_cache_config(name: str) -> Optional[Path]:
    """config.json of ``name`` if an earlier download left it in the hub cache: main's snapshot, else the newest."""
    repo = hub_cache_dir() / ("models--" + name.replace("/", "--"))
    main = repo / "refs" / "main"
    if main.is_file():
        pinned = repo / "snapshots" / main.read_text().strip() / CONFIG_FILE
        if pinned.is_file():
            return pinned
    found = [p for p in repo.glob(f"snapshots/*/{CONFIG_FILE}") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def fetch_hub_config(name: str) -> Path:
    """Download config.json (only) of ``name`` into the hub cache, with huggingface_hub: it honours HF_HUB_OFFLINE,
    HF_TOKEN and HF_ENDPOINT. Each of its failures becomes a one-line UnknownModelError."""
    offline_variable = _offline_variable()
    if offline_variable:  # checked here too: huggingface_hub reads it once, when it is first imported
        raise UnknownModelError(_offline_message(name, f"{offline_variable} is set"))
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    log.info("fetching %s of %s from the Hugging Face Hub", CONFIG_FILE, name)
    try:
        return Path(hf_hub_download(repo_id=name, filename=CONFIG_FILE, cache_dir=str(hub_cache_dir())))
    except GatedRepoError as exc:  # before RepositoryNotFoundError, its base class
        raise UnknownModelError(
            f"model '{name}' is gated on the Hugging Face Hub: request access on its page "
            f"({_hub_page(name)}), then log in with that account {LOGIN_HINT}"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise UnknownModelError(
            f"model '{name}' is not a local folder and does not exist on the Hugging Face Hub, or it is private: "
            f"check the name, or log in with an account that can read it {LOGIN_HINT}"
        ) from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:  # before EntryNotFoundError, a base class
        raise UnknownModelError(_not_fetched_message(name, exc)) from exc
    except EntryNotFoundError as exc:
        raise UnknownModelError(
            f"model '{name}' has no config.json on the Hugging Face Hub: autofit needs a model repository with "
            "a config.json (for an adapter, name its base model), or a local folder with one"
        ) from exc
    except Exception as exc:  # the HTTP client, hence its errors, differs by version (requests, httpx, httpx2)
        raise UnknownModelError(_fetch_failed_message(name, exc)) from exc


def _offline_variable() -> Optional[str]:
    """The variable that puts huggingface_hub offline now, read as huggingface_hub reads it; None when online."""
    variable = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    return variable if os.environ.get(variable, "").upper() in _TRUE_VALUES else None


def _not_fetched_message(name: str, exc: BaseException) -> str:
    """huggingface_hub says "not in the cache, and the hub did not give it": offline, unreachable, or refused."""
    from huggingface_hub import errors
    from huggingface_hub.utils import HfHubHTTPError, OfflineModeIsEnabled

    causes = _causes(exc)
    if any(isinstance(cause, OfflineModeIsEnabled) for cause in causes):
        return _offline_message(name, "huggingface_hub is in offline mode (HF_HUB_OFFLINE)")
    # the hub (or what HF_ENDPOINT names) answered, but not with the file: not a connectivity problem. causes[0]
    # is skipped: before huggingface_hub 1.0, LocalEntryNotFoundError is itself an HfHubHTTPError.
    answered = (HfHubHTTPError, getattr(errors, "FileMetadataError", HfHubHTTPError))
    refusal = next((cause for cause in causes[1:] if isinstance(cause, answered)), None)
    if refusal is not None:
        return _fetch_failed_message(name, refusal)
    network_error = causes[1] if len(causes) > 1 else exc  # what huggingface_hub's own error was raised from
    return _offline_message(name, f"the hub could not be reached ({_one_line(network_error)})")


def _offline_message(name: str, reason: str) -> str:
    return (
        f"model '{name}' is not bundled, not a local folder, and its config.json is not in the Hugging Face cache "
        f"({hub_cache_dir()}); {reason}. Offline, autofit works with a bundled model ({', '.join(bundled_names())}), "
        "a local folder with config.json, or a model fetched once online"
    )


def _fetch_failed_message(name: str, exc: BaseException) -> str:
    return f"could not fetch config.json of model '{name}' from the Hugging Face Hub: {_one_line(exc)}"


def _causes(exc: BaseException) -> List[BaseException]:
    """``exc`` and the errors it was raised from, outermost first."""
    chain = [exc]
    while chain[-1].__cause__ is not None and chain[-1].__cause__ not in chain:
        chain.append(chain[-1].__cause__)
    return chain


def _hub_page(name: str) -> str:
    from huggingface_hub import constants

    return f"{constants.ENDPOINT.rstrip('/')}/{name}"


def _one_line(exc: BaseException) -> str:
    """``Class: message`` on one line: hub errors carry their server message and request id on further lines."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _expand(path: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(path)))
