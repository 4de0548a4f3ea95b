"""An analytic memory model: predict a candidate's peak device memory before probing it.

The model is a ledger of named terms in bytes (weights, gradients, optimizer states, activations, the LM-head/loss
buffer, the RL generation phase, a reference model, the allocator's overhead and the CUDA context), each computed
from the model's configuration dict and the candidate, following ``notes/memory-facts.md`` (sections 2.1 to 2.7
and 5.1). One module per family of terms:

- ``_shape``: the model's sizes from its configuration;
- ``_census``: the parameters tensor by tensor, counted from the model built on the meta device (``_census_build``,
  run in its own process by ``_census_cache``, which keeps the result) or computed from the sizes, and what peft's
  LoRA and bitsandbytes do to them;
- ``_key_table``: every key of a TRL config file, classified by what it does to memory (the launch reads it);
- ``_checked``: the families the prior was checked on, and the wider band of the others;
- ``_parameters``: weights, gradients, optimizer states, a reference model (2.1-2.3, 2.6);
- ``_activations``: what the backward pass keeps, per token and layer (2.4), mixture-of-experts and eager attention
  included;
- ``_activation_policy``: checkpointing, activation offloading and Liger's kernels, read once for every module here
  (their effects on saved activations, recompute passes and host time are intertwined);
- ``_logits``: TRL's fused LM head and the RL generation phase (2.5, 2.6);
- ``_allocator``: the CUDA context and the caching allocator's overhead (2.7, 5.1);
- ``_ledger``: the terms at each phase of a step and the predicted peak;
- ``_throughput``, ``_speed_calibration``: how fast a step runs on a card (``autofit.core``'s cards), and that model
  calibrated on a search's timed steps;
- ``_calibration``: a scale on the static part (what does not depend on the tokens) and one on the dynamic part
  (activations, LM-head buffers, generation), fitted by least squares on measured peaks;
- ``_levels``: the ladder walked over predicted peaks (``autofit estimate``) and the search's grids;
- ``_sharding``, ``_offload``, ``_vllm``: several GPUs, optimizer offload, and vLLM's share of a GPU;
- ``_rungs``: the effect of the rungs that are not built in (another package's, the caller's): their own ``ledger``
  on the terms, or the band they need.

Pure Python: this package imports neither torch nor transformers (the search process never imports torch). Every
coefficient is a named constant with its source; "[V]", "[D]", "[M]" are memory-facts' tags (verified, derived,
from memory), "[A]" marks an assumption that only calibration checks.
"""

from autofit.core import CARDS, Card, card_named
from autofit.memory_model._activation_policy import ActivationPolicy, activation_policy
from autofit.memory_model._activations import (
    ACT_OUTSIDE_LAYERS_BYTES_PER_H,
    activation_bytes_per_token_layer,
    sequence_length,
    train_tokens,
)
from autofit.memory_model._calibration import (
    CALIBRATED_UNCERTAINTY_FLOOR,
    SINGLE_POINT_UNCERTAINTY,
    Calibration,
    calibrate,
    predict_calibrated,
)
from autofit.memory_model._census import Census
from autofit.memory_model._census_cache import NoCausalLM, ensure_census
from autofit.memory_model._checked import (
    CHECKED,
    UNMODELLED_ARGS,
    prior_uncertainty,
    sizes_are_exact,
    unchecked_reason,
    unmodelled,
    unmodelled_args,
)
from autofit.memory_model._first_step import StepPeaks, step_peaks
from autofit.memory_model._host_time import host_figures, host_line, host_of, steps_on_host
from autofit.memory_model._key_table import (
    NO_MEMORY,
    NOT_PROBED,
    PROBED_KEY,
    SAME_AS_DEFAULT,
    classify_key,
    means_the_default,
)
from autofit.memory_model._key_table import markdown as key_table_markdown
from autofit.memory_model._ledger import (
    PRIOR_UNCERTAINTY,
    TERM_GROUPS,
    TERM_HELP,
    TERMS,
    Ledger,
    host_bytes,
    phase_ledgers,
    predict,
)
from autofit.memory_model._levels import (
    LevelEstimate,
    RungEstimate,
    base_candidate,
    divisors,
    expected_rung,
    length_grid,
    start_state,
)
from autofit.memory_model._logits import (
    GEN_LOGITS_COPIES,
    GEN_PREFILL_HIDDEN_COPIES,
    GEN_PREFILL_MLP_COPIES,
    fused_head_buffer_bytes,
    kv_cache_bytes,
)
from autofit.memory_model._parameters import (
    ParamCounts,
    Tensors,
    census_for,
    lora_params,
    optimizer_known,
    optimizer_state_bytes,
    param_counts,
    trainable_tensors,
)
from autofit.memory_model._rungs import Facts as ModelFactsOf
from autofit.memory_model._rungs import rung_band, rung_notes
from autofit.memory_model._shape import ModelShape, analytic_census, dtype_bytes, shape_or_none
from autofit.memory_model._speed_band import PRIOR_SPEED_UNCERTAINTY
from autofit.memory_model._speed_calibration import SpeedCalibration, calibrate_speed
from autofit.memory_model._throughput import (
    SpeedEstimate,
    measured_rates_card,
    predict_speed,
)
from autofit.memory_model._vllm import (
    VLLM_MODES,
    VllmMeasured,
    candidate_share,
    capture_sizes,
    equivalent_utilization,
    graph_counts,
    server_fits,
    server_share,
    vllm_need,
    vllm_share,
    vllm_term,
)
from autofit.memory_model._vllm_lines import level_vllm_line, vllm_lines
from autofit.memory_model._vllm_recorded import RECORDS as VLLM_RECORDS
from autofit.memory_model._vllm_recorded import UNMODELLED_BAND as VLLM_UNMODELLED_BAND
from autofit.memory_model._vllm_recorded import parse_log as parse_vllm_log

__all__ = [
    "NO_MEMORY", "NOT_PROBED", "PROBED_KEY", "SAME_AS_DEFAULT", "classify_key", "key_table_markdown",
    "means_the_default",
    "StepPeaks", "step_peaks",
    "ActivationPolicy", "activation_policy",
    "CARDS", "Card", "PRIOR_SPEED_UNCERTAINTY", "SpeedEstimate", "card_named", "measured_rates_card",
    "predict_speed", "host_figures", "host_line", "host_of", "steps_on_host",
    "SpeedCalibration", "calibrate_speed",
    "UNMODELLED_ARGS", "optimizer_known", "unmodelled", "unmodelled_args",
    "ACT_OUTSIDE_LAYERS_BYTES_PER_H", "CALIBRATED_UNCERTAINTY_FLOOR", "CHECKED", "Calibration", "Census",
    "GEN_LOGITS_COPIES", "GEN_PREFILL_HIDDEN_COPIES", "GEN_PREFILL_MLP_COPIES", "Ledger", "LevelEstimate",
    "ModelShape", "NoCausalLM", "PRIOR_UNCERTAINTY", "ParamCounts", "RungEstimate", "SINGLE_POINT_UNCERTAINTY",
    "TERMS", "TERM_GROUPS", "TERM_HELP", "Tensors", "VLLM_MODES", "candidate_share", "vllm_need", "vllm_term",
    "activation_bytes_per_token_layer",
    "ModelFactsOf", "analytic_census", "base_candidate", "start_state", "calibrate", "census_for",
    "divisors", "dtype_bytes", "ensure_census",
    "expected_rung", "fused_head_buffer_bytes", "host_bytes", "kv_cache_bytes", "length_grid", "lora_params",
    "optimizer_state_bytes", "param_counts", "phase_ledgers", "predict", "predict_calibrated", "prior_uncertainty",
    "rung_band", "rung_notes", "sequence_length", "shape_or_none", "sizes_are_exact", "train_tokens",
    "trainable_tensors", "unchecked_reason",
    "vllm_lines", "vllm_share", "server_fits", "server_share",
    "VllmMeasured", "capture_sizes", "equivalent_utilization", "graph_counts",
    "VLLM_RECORDS", "VLLM_UNMODELLED_BAND", "level_vllm_line", "parse_vllm_log",
]
