"""Every key of a ``trl <algo> --config`` file, classified: what autofit does with it.

A TRL user's file is the launch autofit answers for, so no key may be dropped in silence. Each field of the TRL
config classes (TrainingArguments and the trainers' own), ModelConfig, the scripts' arguments and the dataset
mixture is one of:

- ``modelled``: the memory model reads it and the probes run it as written (or as the ladder changed it);
- ``probed``: the probes run it as written, the memory model does not describe it: a file that sets it gets a note
  and the wide band, and the probes' peaks are the truth;
- ``no-memory``: it changes no peak (a learning rate, a log setting, a hub name): passed to the probes and kept;
- ``not-probed``: a probe leaves it out for the reason given (it writes no checkpoint, evaluates nothing...); the
  export keeps it as written.

A key the table does not know (a field a newer TRL added) is named in a note and gets the wide band, never silence;
``tests/memory_model/test_key_table.py`` fails when the installed TRL or transformers has a field the table does not
classify.
The table covers the declared floors too (transformers 4.56's older fields). ``docs/keys.md`` is generated from it
(``python -m autofit.launch._keys_page``, with accelerate's keys).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

from autofit.core import KNOBS, MODELLED, PROBED

NO_MEMORY = "no-memory"
NOT_PROBED = "not-probed"
KINDS = KEY_KINDS = (MODELLED, PROBED, NO_MEMORY, NOT_PROBED)
PROBED_KEY = PROBED

# The knobs' keys (checkpointing, the optimizer, LoRA, quantization, ...) are the knob table's rows
# (``autofit.core._knob_table``); these are the modelled keys no knob owns.
_MODELLED = {
    "steps_per_generation": "the generation batch (RL)",
    "generation_batch_size": "the generation batch (RL)",
    "use_cpu": "the device",
    "model_name_or_path": "the model's shapes",
}

_PROBED = {
    "bf16": "mixed precision (the ledger assumes bf16 autocast)",
    "fp16": "fp16 mixed precision",
    "tf32": "TF32 matmuls (no memory of its own)",
    "torch_compile": "torch.compile", "torch_compile_backend": "torch.compile", "torch_compile_mode": "torch.compile",
    "fsdp_min_num_params": "an FSDP configuration", "fsdp_transformer_layer_cls_to_wrap": "an FSDP configuration",
    "parallelism_config": "accelerate's parallelism configuration",
    "accelerator_config": "accelerate's settings",
    "padding_free": "padding-free batches (the probes pad every row to full length: a bound)",
    "packing": "packed rows (the probes' rows are full length: a bound)",
    "packing_strategy": "packed rows", "pad_to_multiple_of": "padding",
    "activation_checkpointing_kwargs": "checkpointing's options (use_reentrant)",
    "gradient_checkpointing_kwargs": "checkpointing's options (use_reentrant)",
    "torch_empty_cache_steps": "the allocator's cache emptied every N steps",
    "optim_args": "the optimizer's arguments", "optim_target_modules": "the optimizer's target modules",
    "adafactor": "Adafactor (transformers 4)",
    "neftune_noise_alpha": "NEFTune's noise",
    "loss_type": "the loss", "completion_only_loss": "the loss's mask", "assistant_only_loss": "the loss's mask",
    "router_aux_loss_coef": "the router's loss (mixture of experts)",
    "ddp_bucket_cap_mb": "DDP's gradient buckets", "ddp_find_unused_parameters": "DDP",
    "ddp_broadcast_buffers": "DDP", "ddp_static_graph": "DDP", "ddp_backend": "DDP",
    "average_tokens_across_devices": "several processes",
    "use_cache": "the KV cache in training forwards",
    "cast_lm_head_to_fp32": "an fp32 LM head (GRPO)",
    "cache_implementation": "the generation's KV cache", "use_transformers_paged": "paged generation",
    "use_transformers_continuous_batching": "continuous batching",
    "transformers_continuous_batching_config": "continuous batching",
    "ds3_gather_for_generation": "ZeRO-3's gathered weights for generation",
    "num_iterations": "iterations per generation (RL)", "sync_ref_model": "the reference model's sync",
    "ref_model_mixup_alpha": "the reference model's sync", "ref_model_sync_steps": "the reference model's sync",
    "disable_dropout": "dropout",
    "max_tool_calling_iterations": "tool calls in generation",
    "entropy_coef": "an entropy term (GRPO)", "use_adaptive_entropy": "an entropy term (GRPO)",
    "top_entropy_quantile": "the entropy mask (GRPO)",
    "vllm_tensor_parallel_size": "vLLM",
    "vllm_model_impl": "vLLM",
    "lora_target_parameters": "LoRA on parameters", "use_dora": "DoRA adapters",
    "lora_task_type": "the adapter's task",
    "model_revision": "the model's revision: the probes build the configuration autofit read, not that revision's "
                      "(named where it is not main; best.yaml keeps it)",
    "chat_template_path": "the chat template (the probes' rows are synthetic)",
    "eos_token": "special tokens", "pad_token": "special tokens",
    "truncation_mode": "truncation (the probes' rows are full length)",
    "dataset_text_field": "the data (the probes' rows are synthetic)",
    "dataset_kwargs": "the data (the probes' rows are synthetic)",
    "remove_unused_columns": "the data's columns",
    "label_smoothing_factor": "label smoothing",
    "jit_mode_eval": "evaluation", "use_ipex": "Intel's extension", "torchdynamo": "torch.compile (transformers 4)",
    "half_precision_backend": "mixed precision's backend", "fp16_opt_level": "apex's fp16",
    "fp16_backend": "mixed precision's backend", "use_mps_device": "the device", "no_cuda": "the device",
    "tpu_num_cores": "TPUs", "group_by_length": "batches grouped by length",
    "length_column_name": "batches grouped by length", "train_sampling_strategy": "the sampler",
    "importance_sampling_level": "the loss (GRPO)",
    "generation_kwargs": "generation settings (the probes force every completion to full length)",
    "precompute_ref_batch_size": "the batch of the reference's precompute pass (DPO, KTO; the micro-batch where unset)",
}

_NO_MEMORY = (
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "lr_scheduler_type",
    "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio", "seed", "data_seed", "full_determinism",
    "log_level", "log_level_replica", "log_on_each_node", "logging_first_step", "logging_nan_inf_filter",
    "disable_tqdm", "debug", "skip_memory_metrics", "include_num_input_tokens_seen", "include_tokens_per_second",
    "local_rank", "ddp_timeout", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_drop_last", "dataloader_in_order", "dataloader_multiprocessing_context",
    "ignore_data_skip", "auto_find_batch_size", "do_train", "shuffle_dataset", "dataset_num_proc",
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "epsilon", "epsilon_high", "delta",
    "scale_rewards", "reward_weights", "mask_truncated_completions", "multi_objective_aggregation",
    "normalize_advantages", "reward_clip_range", "center_rewards_coefficient", "entropy_coef_delta",
    "entropy_coef_max", "entropy_coef_min", "entropy_target", "use_bias_correction_kl", "off_policy_mask_threshold",
    "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_neg", "vespo_k_pos", "vespo_lambda_neg",
    "vespo_lambda_pos", "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
    "vllm_group_port", "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout",
    "vllm_structured_outputs_regex", "chat_template_kwargs", "log_completions",
    "log_completions_hub_repo", "log_multimodal", "log_unique_prompts", "num_completions_to_print",
    "reward_funcs", "reward_model_name_or_path", "ignore_bias_buffers", "past_index", "ray_scope",
    "mp_parameters", "tpu_metrics_debug", "use_legacy_prediction_loop", "_n_gpu",
    "discopop_tau", "f_alpha_divergence_coef", "f_divergence_type", "label_smoothing", "ld_alpha", "loss_weights",
    "use_weighting", "desirable_weight", "undesirable_weight",
)

_EVALUATION = "evaluation: a probe has no evaluation data and measures training"
_CHECKPOINTS = "checkpoints: a probe writes none"
_HUB = "the hub: a probe pushes nowhere"
_LOGGING = "logging: a probe reports nowhere"
_LENGTH = "the run's length: a probe runs its own few steps"
_DATA = "the data set: a probe trains on synthetic rows of the worst case"
_NOT_PROBED = {
    **dict.fromkeys(("eval_strategy", "eval_steps", "do_eval", "do_predict", "eval_on_start", "eval_delay",
                     "eval_accumulation_steps", "eval_do_concat_batches", "eval_use_gather_object",
                     "per_device_eval_batch_size", "per_gpu_eval_batch_size", "bf16_full_eval", "fp16_full_eval",
                     "prediction_loss_only", "batch_eval_metrics", "include_for_metrics",
                     "include_inputs_for_metrics", "label_names", "load_best_model_at_end", "metric_for_best_model",
                     "greater_is_better", "eval_packing", "num_generations_eval"), _EVALUATION),
    **dict.fromkeys(("output_dir", "overwrite_output_dir", "save_strategy", "save_steps", "save_total_limit",
                     "save_on_each_node", "save_only_model", "save_safetensors", "resume_from_checkpoint",
                     "restore_callback_states_from_checkpoint", "enable_jit_checkpoint"), _CHECKPOINTS),
    **dict.fromkeys(("push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo",
                     "hub_always_push", "hub_revision", "push_to_hub_model_id", "push_to_hub_organization",
                     "push_to_hub_token"), _HUB),
    **dict.fromkeys(("report_to", "logging_dir", "run_name", "project", "trackio_space_id", "trackio_bucket_id",
                     "trackio_static_space_id", "logging_steps", "logging_strategy"), _LOGGING),
    **dict.fromkeys(("num_train_epochs", "max_steps"), _LENGTH),
    **dict.fromkeys(("dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split",
                     "dataset_streaming", "datasets", "streaming", "test_split_size"), _DATA),
    "per_gpu_train_batch_size": "deprecated by transformers for per_device_train_batch_size",
}

TABLE: Dict[str, Tuple[str, str]] = {
    **{key: (k.kind, words) for k in KNOBS for key, words in {**k.training_keys, **k.model_keys}.items()},
    **{key: (MODELLED, why) for key, why in _MODELLED.items()},
    **{key: (PROBED, why) for key, why in _PROBED.items()},
    **{key: (NO_MEMORY, "") for key in _NO_MEMORY},
    **{key: (NOT_PROBED, why) for key, why in _NOT_PROBED.items()},
}


# Values that mean a field's default where the class declares another (TRL's bf16=None is bf16 where the device has
# it, as on every GPU autofit plans for).
SAME_AS_DEFAULT = {"bf16": (None, True)}


def means_the_default(key: str, value: object, default: object) -> bool:
    return value == default or (key in SAME_AS_DEFAULT and value in SAME_AS_DEFAULT[key])


def classify(key: str) -> Optional[Tuple[str, str]]:
    """(kind, why) for a key of a TRL config file; None for a key the table does not know."""
    return TABLE.get(key)


classify_key = classify


def unclassified(keys: Iterable[str]) -> List[str]:
    """The keys the table does not classify, sorted."""
    return sorted(key for key in set(keys) if key not in TABLE)


def markdown() -> str:
    """The table as docs/keys.md shows it."""
    lines = ["# Every key of your TRL config file", "",
             "Generated from `autofit/memory_model/_key_table.py` and `autofit/launch/_accelerate_keys.py` "
             "(`python -m autofit.launch._keys_page > docs/keys.md`).",
             "What autofit does with each field of TRL's config classes, ModelConfig, the scripts' arguments and the "
             "data set mixture: `modelled` (the memory model reads it, the probes run it), `probed` (the probes run "
             "it as written; the estimate names it and widens its band), `no-memory` (no peak changes), "
             "`not-probed` (a probe leaves it out for the reason given; best.yaml keeps it). A key a newer TRL adds "
             "is named in a note and gets the wide band.", "",
             "| key | kind | what |", "|---|---|---|"]
    for key in sorted(TABLE):
        kind, why = TABLE[key]
        lines.append(f"| `{key}` | {kind} | {why} |")
    return "\n".join(lines) + "\n"
