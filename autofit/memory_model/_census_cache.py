"""Get a model's parameter census (``_census``): from the cache, else built once in its own process.

The build (``_census_build``) imports torch and transformers and instantiates the architecture on the meta device;
the search process imports neither, so it runs ``python -m autofit.memory_model._census_build`` with the GPU hidden
and keeps the result under the cache folder, keyed by the configuration and the installed transformers (a new version
may build a model differently). Where it cannot build (a model that needs its own code without
``--trust-remote-code``, an architecture this transformers does not know), the memory model falls back to the
configuration's sizes and says the numbers are unchecked.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Union

from autofit.memory_model._census import META, Census, cached_census, store_census
from autofit.memory_model._census_build import NO_CAUSAL_LM_EXIT
from autofit.memory_model._checked import sizes_are_exact
from autofit.memory_model._shape import ModelShape

log = logging.getLogger(__name__)


class NoCausalLM(ValueError):
    """The architecture has no class AutoModelForCausalLM can build: TRL's trainers cannot load it by name."""


BUILD_TIMEOUT_S = 300  # a 405B architecture on the meta device takes under a minute; a hung import does not end


def ensure_census(model: str, *, trust_remote_code: bool = False) -> Optional[Census]:
    """The census of ``model`` (a bundled name, a folder or a hub id), built now if it is not cached; None when the
    configuration's sizes are exact for its family or unreadable (no memory model then), or (logged) when the
    architecture cannot be built here."""
    from autofit.machine import needs_own_code, resolve_model

    source = resolve_model(model)
    found = cached_census(source.config)
    if found is not None:
        return found
    try:
        shape = ModelShape.from_config(source.config)
    except (KeyError, ValueError, TypeError, ArithmeticError):
        return None  # sizes the memory model cannot read: no ledger to count for (the search bisects plainly)
    if sizes_are_exact(shape):
        return None  # the configuration's sizes are exact for this family: nothing to build
    own_code = needs_own_code(source.config)
    if own_code and not (trust_remote_code and source.local_path):
        log.info("no parameter census for %s: its architecture (%s) is its own code", model, own_code)
        return None
    data = _build(source.config, source.local_path if own_code else None)
    if data == NO_CAUSAL_LM_EXIT:
        raise NoCausalLM(f"model '{model}' ({source.config.get('model_type')}) has no causal-LM class in the installed "
                         "transformers (AutoModelForCausalLM cannot build it, so TRL cannot load it by name): autofit "
                         "searches text models; pass your own trainer_factory for this one")
    if not isinstance(data, dict):
        return None
    store_census(source.config, data)
    return Census.from_dict({**data, "source": META})


def _build(config: Dict[str, Any], code_dir: Optional[str]) -> Union[Dict[str, Any], int, None]:
    with tempfile.TemporaryDirectory(prefix="autofit-census-") as tmp:
        folder = code_dir or tmp
        if code_dir is None:
            Path(tmp, "config.json").write_text(json.dumps(config))
        out = Path(tmp, "census.json")
        command = [sys.executable, "-m", "autofit.memory_model._census_build", folder, str(out)]
        if code_dir is not None:
            command.append("--trust-remote-code")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRANSFORMERS_VERBOSITY": "error"}
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("could not count the parameters of %s from the model: %s", config.get("model_type"), exc)
            return None
        if done.returncode == NO_CAUSAL_LM_EXIT:
            return NO_CAUSAL_LM_EXIT
        if done.returncode != 0 or not out.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            log.warning("could not count the parameters of %s from the model: %s", config.get("model_type"), last)
            return None
        built: Dict[str, Any] = json.loads(out.read_text())
        return built
