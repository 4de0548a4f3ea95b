"""The vocabulary both processes share, torch-free: the options every door declares once (``SearchOptions``), the
question they resolve to (``SearchSpec``), one configuration to probe (``Candidate``) and the knobs it turns, what a
probe found (``ProbeResult``, ``Outcome``), the cards and engines, sizes, text kept to one line, the input error. The
machine itself (the device, files, ``--out``, where a model's configuration is found) is ``autofit.machine``.

Nothing here imports another part of autofit: every other package builds on it.
"""

from autofit.core._algorithms import ALGORITHMS, DEFAULT_ALGO, PRECOMPUTE, algorithm, algorithm_names
from autofit.core._candidate import RL_ALGOS, Candidate
from autofit.core._candidate_fields import ProbeSettings
from autofit.core._cards import CARDS, Card, card_named
from autofit.core._compat import installed_versions, vllm_installed
from autofit.core._engines import DDP, ENGINES, engine_for, engine_of
from autofit.core._errors import InputError
from autofit.core._knob import MODELLED, PROBED, FileRun, Knob
from autofit.core._knob_table import KNOBS, TRL_KEYS, user_dtype, user_trusts_code
from autofit.core._knobs import as_trained, blocks, keys_of
from autofit.core._launch import Launch, LaunchEngine, TrlFile
from autofit.core._options import (
    ESTIMATE,
    FIELDS,
    FIT,
    SEARCH,
    SearchOptions,
    add_options,
    door_fields,
    given_values,
    ladder_names,
)
from autofit.core._outcome import INFRASTRUCTURE, PLUGIN, USER, FactoryMisuse, Outcome, PluginStepError, ProbeResult
from autofit.core._secrets import masked, url_parts
from autofit.core._settings import LoraSettings, runnable_attention
from autofit.core._sizes import format_size, parse_size
from autofit.core._spec import MAX_EFFECTIVE_BATCH, SEARCHED_ARGS, Baseline, SearchSpec
from autofit.core._text import clip, one_line

__all__ = [
    "ALGORITHMS", "DEFAULT_ALGO", "PRECOMPUTE", "algorithm", "algorithm_names",
    "RL_ALGOS", "Candidate", "ProbeSettings",
    "CARDS", "Card", "card_named",
    "installed_versions", "vllm_installed",
    "DDP", "ENGINES", "engine_for", "engine_of",
    "InputError",
    "MODELLED", "PROBED", "FileRun", "Knob",
    "KNOBS", "TRL_KEYS", "user_dtype", "user_trusts_code",
    "as_trained", "blocks", "keys_of",
    "Launch", "LaunchEngine", "TrlFile",
    "ESTIMATE", "FIELDS", "FIT", "SEARCH", "SearchOptions", "add_options", "door_fields", "given_values",
    "ladder_names",
    "INFRASTRUCTURE", "PLUGIN", "USER", "FactoryMisuse", "Outcome", "PluginStepError", "ProbeResult",
    "masked", "url_parts",
    "LoraSettings", "runnable_attention",
    "format_size", "parse_size",
    "MAX_EFFECTIVE_BATCH", "SEARCHED_ARGS", "Baseline", "SearchSpec",
    "clip", "one_line",
]
