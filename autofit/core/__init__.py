"""The vocabulary both processes share, torch-free: the options every door declares once (``SearchOptions``), the
question they resolve to (``SearchSpec``), one configuration to probe (``Candidate``), what a probe found
(``ProbeResult``, ``Outcome``), where a model's configuration comes from (``resolve_model``), the device (through
NVML, never CUDA), files written whole, sizes and the one input error.

Nothing here imports another part of autofit: every other package builds on it.
"""

from autofit.core._accelerate_keys import accelerate_notes, classify_accelerate
from autofit.core._algorithms import (
    ALGORITHMS,
    DEFAULT_ALGO,
    PRECOMPUTE,
    Algorithm,
    algorithm,
    algorithm_names,
    ppo_available,
)
from autofit.core._allocator_env import ALLOC_ENV, LEGACY_ALLOC_ENV, allocator_options
from autofit.core._candidate import LENGTH_FIELD, RL_ALGOS, Candidate, ProbeSettings
from autofit.core._cards import CARDS, Card, card_named, card_of_device
from autofit.core._compat import (
    checkpointing_field,
    exempt_phases,
    installed,
    installed_versions,
    vllm_installed,
    vllm_reserved,
)
from autofit.core._device import (
    RATE_NAMES,
    GpuInfo,
    NoCudaDeviceError,
    driver_version,
    first_gpu,
    priced_card,
    resolve_device,
    resolve_gpus,
    visible_gpu_count,
)
from autofit.core._errors import InputError
from autofit.core._files import (
    atomic_write_text,
    cache_dir,
    cache_entry,
    cache_subfolder,
    clip,
    entry_problem,
    one_line,
    read_own_file,
)
from autofit.core._key_table import KEY_KINDS, PROBED_KEY, SAME_AS_DEFAULT, classify_key, means_the_default
from autofit.core._kinds import DEVICE_IDS, SECONDS, Kind
from autofit.core._knob import FileRun, Knob
from autofit.core._knob_peft import targets
from autofit.core._knob_table import (
    ACTIVATION_OFFLOADING,
    BATCH_KEYS,
    INIT_KWARGS,
    KNOBS,
    USE_LIGER,
    VLLM_CONTEXT_KEY,
    VLLM_SHARE_KEY,
    user_dtype,
    user_trusts_code,
)
from autofit.core._knobs import (
    as_trained,
    blocks,
    file_baseline,
    file_options,
    keys_of,
    knob,
    knob_of_key,
    model_args,
    observe_trainer,
    option_file_keys,
    read_keys,
)
from autofit.core._launch import Launch, LaunchEngine, TrlFile
from autofit.core._options import (
    DEVICES,
    ESTIMATE,
    FIELDS,
    FIT,
    GROUP_ALGOS,
    SEARCH,
    SearchOptions,
    add_options,
    door_fields,
    given_values,
    ladder_names,
)
from autofit.core._others import DISTURBED_RETRY_WAIT_S, disturbed, free_bytes, other_processes, others_bytes
from autofit.core._outcome import (
    BAD_FORK,
    CANNOT_CREATE_EXIT,
    ENGINE_FAILURE,
    INFRASTRUCTURE,
    KERNEL_FAILURE,
    PLUGIN,
    USER,
    BuildTimeout,
    FactoryMisuse,
    Outcome,
    PluginStepError,
    ProbeResult,
    classify_exception,
    classify_exit,
    error_origin,
    user_file,
)
from autofit.core._outdir import PHASE_FILE, PID_FILE, check_folder_private, exclusive, record_probe_process
from autofit.core._registry import UnknownModelError, needs_own_code, resolve_model
from autofit.core._secrets import masked, masked_argv, scrubbed, url_parts, url_secrets
from autofit.core._settings import LoraSettings, QuantSettings, runnable_attention
from autofit.core._sizes import format_size, parse_size
from autofit.core._spec import FACTORIES, MAX_EFFECTIVE_BATCH, SEARCHED_ARGS, Baseline, SearchSpec

__all__ = [
    "ALLOC_ENV", "LEGACY_ALLOC_ENV", "MAX_EFFECTIVE_BATCH", "allocator_options",
    "CARDS", "Card", "card_named", "card_of_device", "ACTIVATION_OFFLOADING", "BATCH_KEYS", "INIT_KWARGS", "USE_LIGER",
    "VLLM_CONTEXT_KEY", "VLLM_SHARE_KEY",
    "Launch", "LaunchEngine", "TrlFile",
    "KNOBS", "FileRun", "Knob", "as_trained", "blocks", "file_baseline", "file_options", "keys_of", "knob",
    "knob_of_key", "model_args", "observe_trainer", "option_file_keys", "read_keys", "targets", "user_dtype",
    "user_trusts_code",
    "KEY_KINDS", "PROBED_KEY", "SAME_AS_DEFAULT", "classify_key", "means_the_default",
    "accelerate_notes", "classify_accelerate",
    "ESTIMATE", "FIELDS", "FIT", "SEARCH", "SEARCHED_ARGS", "Baseline", "add_options", "cache_entry", "cache_subfolder",
    "door_fields", "entry_problem", "given_values", "ladder_names",
    "ALGORITHMS", "DEFAULT_ALGO", "PRECOMPUTE", "Algorithm", "algorithm", "algorithm_names",
    "BAD_FORK", "CANNOT_CREATE_EXIT", "DEVICES", "DISTURBED_RETRY_WAIT_S", "ENGINE_FAILURE", "FACTORIES",
    "GROUP_ALGOS", "INFRASTRUCTURE",
    "KERNEL_FAILURE", "LENGTH_FIELD", "PHASE_FILE", "PID_FILE", "RL_ALGOS", "PLUGIN", "USER", "BuildTimeout",
    "Candidate", "FactoryMisuse", "GpuInfo", "InputError", "LoraSettings", "NoCudaDeviceError", "Outcome",
    "PluginStepError", "ProbeResult", "QuantSettings", "runnable_attention",
    "ProbeSettings", "SearchOptions", "SearchSpec", "UnknownModelError", "atomic_write_text", "cache_dir", "clip",
    "checkpointing_field", "classify_exception", "classify_exit", "disturbed", "error_origin", "exclusive",
    "exempt_phases", "vllm_reserved", "first_gpu", "priced_card", "format_size", "free_bytes", "installed",
    "installed_versions",
    "needs_own_code",
    "one_line", "driver_version", "read_own_file", "RATE_NAMES", "DEVICE_IDS", "SECONDS", "Kind",
    "other_processes", "others_bytes", "parse_size", "ppo_available", "record_probe_process", "resolve_device",
    "resolve_gpus", "resolve_model", "user_file", "visible_gpu_count", "vllm_installed",
    "check_folder_private", "masked", "masked_argv", "scrubbed", "url_parts", "url_secrets",
]
