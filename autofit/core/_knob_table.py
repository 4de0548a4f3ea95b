"""The knob table: every setting a rung turns and every stage reads, each declared once with the TRL keys it owns
(``autofit.core._knob`` says what a declaration holds; ``autofit.core._knobs`` derives what the stages read).

The order is the order best.yaml and the training arguments write their keys in. Only here are a knob's keys
spelled: a rung names its knob (``knob("checkpointing").keys``), the export and the key table read them from here.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from autofit.core._algorithms import algorithm
from autofit.core._candidate_fields import CandidateFields
from autofit.core._compat import checkpointing_field, vllm_installed
from autofit.core._knob import PROBED, FileRun, Knob
from autofit.core._knob_peft import LORA, QUANTIZATION
from autofit.core._settings import runnable_attention

TRL_VLLM_UTILIZATION = 0.3  # GRPOConfig.vllm_gpu_memory_utilization
# Keys the table spells by name (other stages read them as TRL_KEYS' fields; the batch split as keys_of("batch"))
BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps")
INIT_KWARGS = "model_init_kwargs"  # where TRL's scripts put ModelConfig's dtype and attention for the trainer
ACTIVATION_OFFLOADING = "activation_offloading"
USE_LIGER = "use_liger_kernel"
USE_VLLM, VLLM_SHARE_KEY, VLLM_CONTEXT_KEY = "use_vllm", "vllm_gpu_memory_utilization", "vllm_max_model_length"
VLLM_SLEEP_KEY = "vllm_enable_sleep_mode"


@dataclass(frozen=True)
class TrlKeys:
    """The keys a stage reads by name, beside the knobs that own them: a built trainer's switch its rung's probe step
    checks it took, a user's own value a rung defers to, the dtype and attention the export folds into ModelConfig."""

    init_kwargs: str = INIT_KWARGS
    activation_offloading: str = ACTIVATION_OFFLOADING
    use_liger: str = USE_LIGER
    vllm_mode: str = "vllm_mode"
    vllm_share: str = VLLM_SHARE_KEY
    vllm_context: str = VLLM_CONTEXT_KEY
    vllm_sleep: str = VLLM_SLEEP_KEY


TRL_KEYS = TrlKeys()


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _said(words: str) -> Any:
    return lambda key, candidate, context: words


# -- the searched knobs ---------------------------------------------------------------------------------------------
BATCH = Knob(
    "batch", fields=("micro_batch", "grad_accum"), searched=True,
    training_keys=dict(zip(BATCH_KEYS, ("the micro-batch (the search's)", "accumulation (effective batch kept)"),
                           strict=True)),
    training=lambda c: dict(zip(BATCH_KEYS, (c.micro_batch, c.grad_accum), strict=True)),
    options=lambda run: ({"effective_batch": run.training[BATCH_KEYS[0]] * run.training[BATCH_KEYS[1]]}
                         if all(_int(run.training.get(key)) for key in BATCH_KEYS) else {}),
    said_after=lambda key, c: "effective batch")


def _checkpointing_of(run: FileRun) -> Dict[str, Any]:
    value = run.training.get("activation_checkpointing")
    if value is None:
        value = run.training.get("gradient_checkpointing")
    return {"checkpointing": bool(value)}


CHECKPOINTING = Knob(
    "checkpointing", fields=("checkpointing",), searched=True,
    # transformers 5.23 renamed the field; setting only gradient_checkpointing there can silently keep it on, so the
    # candidate writes whichever name the installed transformers has (autofit.core._compat)
    training_keys={"activation_checkpointing": "checkpointing",
                   "gradient_checkpointing": "checkpointing (the name before transformers 5.23)"},
    training=lambda c: {checkpointing_field(): c.checkpointing},
    baseline=_checkpointing_of,
    said_after=lambda key, c: None if c.checkpointing else "baseline: off is fastest and fits")


def _length_words(key: str, candidate: CandidateFields, context: Mapping[str, Any]) -> Optional[str]:
    if context.get("maximize") == "length":
        return "longest that fits (--maximize length)"
    if candidate.max_length >= context.get("asked_length", candidate.max_length):
        return "--max-completion-length" if candidate.is_rl else "--max-length"
    return None


def _length_of(run: FileRun) -> Dict[str, Any]:
    key = algorithm(run.algo).length_field
    return {key: run.training[key]} if _int(run.training.get(key)) else {}


LENGTH = Knob(
    "length", fields=("max_length",), searched=True,
    training_keys={"max_length": "the sequence length (the search's)",
                   "max_completion_length": "the completion length (the search's, RL)"},
    option_keys={"max_length": "max_length", "max_completion_length": "max_completion_length"},
    training=lambda c: {c.unit.length_field: c.max_length}, options=_length_of, said_before=_length_words)

# -- what the rungs turn --------------------------------------------------------------------------------------------
OPTIM = Knob(
    "optim", fields=("optim",), reads=("optim",), training_keys={"optim": "the optimizer's states"},
    training=lambda c: {"optim": c.optim} if c.optim is not None else {},
    baseline=lambda run: {"optim": run.training.get("optim") if "optim" in run.written else None})


DTYPE = Knob(
    "dtype", fields=("dtype",), late=("dtype",),
    training_keys={INIT_KWARGS: "the weights' dtype"}, model_keys={"dtype": "the weights' dtype (ModelConfig)"},
    option_keys={"dtype": "dtype"},
    training=lambda c: {INIT_KWARGS: {"dtype": c.dtype}} if c.dtype is not None else {},
    model=lambda c, observed: {"dtype": c.dtype} if c.dtype is not None else {},  # TRL's --dtype, passed on as
    options=lambda run: ({"dtype": run.model["dtype"]}                            # model_init_kwargs by its scripts
                         if "dtype" in run.written and run.model.get("dtype") not in (None, "float32") else {}),
    said_after=lambda key, c: "--dtype" if c.dtype is not None else None)


ACTIVATION_OFFLOAD = Knob(
    "activation_offload", fields=("activation_offload",), late=("activation_offload",),
    reads=(ACTIVATION_OFFLOADING,),
    training_keys={ACTIVATION_OFFLOADING: "activation offloading"},
    training=lambda c: {ACTIVATION_OFFLOADING: True} if c.activation_offload else {},
    baseline=lambda run: {"activation_offload": bool(run.training.get(ACTIVATION_OFFLOADING))})

PRECOMPUTE_REF = Knob(
    "precompute_ref", fields=("precompute_ref",), late=("precompute_ref",), reads=("precompute_ref_log_probs",),
    training_keys={"precompute_ref_log_probs": "the reference model (not loaded: its log-probs precomputed)"},
    training=lambda c: {"precompute_ref_log_probs": True} if c.precompute_ref else {},
    baseline=lambda run: {"precompute_ref": bool(run.training.get("precompute_ref_log_probs"))})

# The layer kernels only: TRL keeps its own fused LM head and turns Liger's fused cross-entropy off, but after
# transformers before 5 has applied the kernels (in Trainer.__init__): so it is said here. The user's own
# use_liger_kernel passes through to the probes as written.
LIGER = Knob(
    "liger", fields=("liger",), late=("liger",),
    training_keys={USE_LIGER: "Liger's kernels", "liger_kernel_config": "Liger's kernels"},
    training=lambda c: ({USE_LIGER: True, "liger_kernel_config": {"fused_linear_cross_entropy": False}}
                        if c.liger else {}))


def _attention_of(run: FileRun) -> Dict[str, Any]:
    found = run.model.get("attn_implementation")
    return {"attn_implementation": str(found) if found not in (None, "", "sdpa") else None}  # sdpa: the default


ATTENTION = Knob(
    "attention", fields=("attn_implementation",), late=("attn_implementation",),
    model_keys={"attn_implementation": "the attention kernel (eager keeps the scores), probed as written where this "
                                       "machine runs it; else sdpa, said before any probe; best.yaml keeps yours"},
    # as TRL's scripts pass ModelConfig's attn_implementation; best.yaml writes it as ModelConfig's, which the
    # probes measured (``observed``)
    training=lambda c: ({INIT_KWARGS: {"attn_implementation": c.attn_implementation}}
                        if c.attn_implementation is not None else {}),
    model=lambda c, observed: ({"attn_implementation": observed["attn_implementation"]}
                               if observed.get("attn_implementation") else {}),
    baseline=_attention_of, for_device=lambda value, device: runnable_attention(value, device)[0],
    said_before=_said("the attention implementation the probes measured"))

TRUST_REMOTE_CODE = Knob(
    "trust_remote_code", fields=("trust_remote_code",), late=("trust_remote_code",), reads=("trust_remote_code",),
    training_keys={"trust_remote_code": "the model's own code"},
    training=lambda c: {"trust_remote_code": True} if c.trust_remote_code else {},  # TRL passes it to every loading
    options=lambda run: {"trust_remote_code": True} if run.training.get("trust_remote_code") else {},
    said_before=_said("--trust-remote-code: the model's own code runs"))


def _groups(run: FileRun) -> bool:
    return algorithm(run.algo).groups


NUM_GENERATIONS = Knob(
    "num_generations", fields=("num_generations",), searched=True, reads=("num_generations",),
    training_keys={"num_generations": "completions per prompt (RL)"},
    option_keys={"num_generations": "num_generations"},
    training=lambda c: {"num_generations": c.num_generations} if c.num_generations is not None else {},
    options=lambda run: ({"num_generations": run.training["num_generations"]}
                         if _groups(run) and "num_generations" in run.written else {}),
    trained=lambda c, observed: ({"num_generations": observed["args"]["num_generations"]}
                                 if c.is_rl and c.num_generations is None
                                 and _int((observed.get("args") or {}).get("num_generations")) else {}),
    said_before=_said("--num-generations"))

# The KL coefficient is the user's training argument (``--beta`` adds it to them): the reference model is the
# ledger's where it is > 0
BETA = Knob(
    "beta", reads=("beta",), training_keys={"beta": "the reference model (RL, beta > 0)"}, option_keys={"beta": "beta"},
    options=lambda run: {"beta": run.training["beta"]} if _groups(run) and "beta" in run.written else {},
    said_before=_said("--beta"))


def _vllm_training(candidate: CandidateFields) -> Dict[str, Any]:
    # a probe without vLLM generates itself (the search estimates vLLM's share)
    if not candidate.vllm or (candidate.probe is not None and importlib.util.find_spec("vllm") is None):
        return {}
    args: Dict[str, Any] = {USE_VLLM: True, "vllm_mode": candidate.vllm}
    if candidate.vllm == "colocate":
        args[VLLM_SHARE_KEY] = candidate.vllm_utilization or TRL_VLLM_UTILIZATION
    if candidate.vllm_max_model_length:
        args[VLLM_CONTEXT_KEY] = candidate.vllm_max_model_length
    return args


def _vllm_of(run: FileRun) -> Dict[str, Any]:
    if not _groups(run) or not run.training.get("use_vllm"):
        return {}
    return {"use_vllm": run.training.get("vllm_mode") or "colocate",
            "vllm_gpu_memory_utilization": run.training.get("vllm_gpu_memory_utilization", TRL_VLLM_UTILIZATION)}


def _vllm_context_of(run: FileRun) -> Dict[str, Any]:
    length = run.training.get("vllm_max_model_length")
    return {"vllm_max_model_length": length if _int(length) and run.training.get("use_vllm") else None}


def _vllm_words(key: str, candidate: CandidateFields, context: Mapping[str, Any]) -> str:
    return "--use-vllm" + (" (vLLM was estimated, not probed: not installed where the search ran)"
                           if key == "use_vllm" and not vllm_installed() else "")


VLLM = Knob(
    "vllm", fields=("vllm", "vllm_utilization", "vllm_share_bytes", "vllm_max_model_length", "vllm_server_gpus"),
    late=("vllm", "vllm_utilization", "vllm_share_bytes", "vllm_max_model_length", "vllm_server_gpus"),
    reads=("use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_max_model_length"),
    training_keys={"use_vllm": "vLLM's share of the card", "vllm_mode": "vLLM's share of the card",
                   "vllm_gpu_memory_utilization": "vLLM's share of the card",
                   "vllm_max_model_length": "vLLM's context: the KV cache one sequence must fit to start"},
    option_keys={"use_vllm": "vllm_mode", "vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization"},
    training=_vllm_training, options=_vllm_of, baseline=_vllm_context_of, said_before=_vllm_words)


def _sleep_of(run: FileRun) -> Dict[str, Any]:
    sleeping = _groups(run) and run.training.get("use_vllm") and (run.training.get("vllm_mode") or "colocate") == \
        "colocate" and run.training.get(VLLM_SLEEP_KEY) is True
    return {"vllm_sleep": bool(sleeping)}


# TRL's sleep mode (colocate only: the server's process is its own): vLLM sleeps at level 2 after each generation
# and wakes for the next [S: trl/generation/vllm_generation.py, VLLMGeneration.generate and sync_weights]. The
# user's own vllm_enable_sleep_mode passes through to the probes as written (the ledger reads it), as Liger's does.
VLLM_SLEEP = Knob(
    "vllm_sleep", fields=("vllm_sleep",), late=("vllm_sleep",),
    training_keys={VLLM_SLEEP_KEY: "vLLM's weights and KV cache released outside generation (sleep level 2)"},
    training=lambda c: {VLLM_SLEEP_KEY: True} if c.vllm_sleep and c.vllm == "colocate" and _vllm_training(c) else {},
    baseline=_sleep_of)


def _env_of(run: FileRun) -> Dict[str, Any]:
    env = run.written.get("env")  # TRL sets each variable as str(value)
    return {"env": tuple(sorted((str(k), str(v)) for k, v in env.items())) if isinstance(env, dict) else ()}


ENV = Knob(
    "env", fields=("env",), kind=PROBED,
    training_keys={"env": "the file's env block: every probe's environment, as TRL sets it (the ledger reads the "
                          "allocator's expandable segments)"},
    baseline=_env_of)

# The engines (autofit.rungs: the optimizer-offload engine, the shardings): the user's own are the launch's
# (autofit.launch reads them), autofit's are written as accelerate and DeepSpeed files.
ENGINE = Knob(
    "engine", fields=("offload", "sharding", "ranks"), late=("offload", "sharding", "ranks"),
    training_keys={"deepspeed": "DeepSpeed ZeRO's partitions, buckets and optimizer offload",
                   "fsdp": "the FSDP engine (FSDP2's shards; version 1 as FSDP2)",
                   "fsdp_config": "the FSDP engine's settings"})

def user_dtype(user_args: Any) -> Optional[str]:
    """The dtype the user's own ``model_init_kwargs`` loads the weights in (``torch_dtype``: transformers 4's name);
    None where they set none."""
    init = dict(user_args).get(INIT_KWARGS)
    found = init.get("dtype", init.get("torch_dtype")) if isinstance(init, Mapping) else None
    return str(found) if found else None


def user_trusts_code(user_args: Any) -> bool:
    """Whether the user's own ``model_init_kwargs`` load the model with ``trust_remote_code``: TRL's scripts put these
    over ModelConfig's (``model_init_kwargs.update(training_args.model_init_kwargs)``), so the model's own code runs,
    as with ``trust_remote_code: true``."""
    init = dict(user_args or {}).get(INIT_KWARGS)
    return isinstance(init, Mapping) and init.get("trust_remote_code") is True


KNOBS = (BATCH, CHECKPOINTING, LENGTH, OPTIM, LORA, DTYPE, QUANTIZATION, ACTIVATION_OFFLOAD, PRECOMPUTE_REF, LIGER,
         ATTENTION, TRUST_REMOTE_CODE, NUM_GENERATIONS, BETA, VLLM, VLLM_SLEEP, ENV, ENGINE)
