"""A TRL file's trainer values checked as TRL and vLLM would take them, as the launch is read and before any probe:
one line naming the key as the user wrote it (the file's key, or the launch's flag), its value and what is accepted.
``autofit.launch._door`` calls ``check_trl_values`` where it checks the values the file gives the search's options.

What is refused: what TRL or vLLM refuse only later (in the trainer's first loss, in vLLM's engine, or never for a
config file: argparse checks a field's ``choices`` on the command line only), and coefficients whose loss goes wrong
without a word (a negative or non-finite KL coefficient or KTO weight, a label-smoothing probability its loss divides
by). What they take is taken: a key the run does not use (a ``vllm_*`` key where vLLM does not generate, a
``label_smoothing`` of a loss that ignores it) is not checked.

Read from TRL 1.16 (``trl/trainer/dpo_trainer.py``, ``kto_config.py``, ``grpo_config.py``,
``trl/generation/vllm_generation.py``) and vLLM (``vllm/config/model.py``, ``vllm/config/cache.py``); the DPO loss
types are TRL's list, checked against the installed TRL by tests/launch/test_trl_values.py.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from autofit.core import FIELDS, InputError, TrlFile, algorithm

# DPOTrainer's loss branches; any other name raises "Unknown loss type" at the first loss, after the model is built
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                  "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")
F_DIVERGENCES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")
# the losses built on the chosen-rejected reward difference: DPOTrainer refuses another f-divergence for the others
F_DIVERGENCE_LOSSES = ("sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft")
# vLLM's ModelImpl (vllm/config/model.py); TRL's help names two of them
VLLM_MODEL_IMPLS = ("auto", "vllm", "transformers", "terratorch")
# GRPOTrainer's importance-sampling branches; another raises "Unknown vLLM importance sampling level" in its loss
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
MAX_PORT = 65535


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(file: TrlFile, key: str, value: Any, accepted: str) -> InputError:
    return InputError(f"{file.where(key)} = {value!r} is not valid: {accepted}")


def _in_range(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Callable[[Any], bool]:
    def accepts(value: Any) -> bool:
        return _number(value) and (value > low if low_open else value >= low) \
            and (value < high if high_open else value <= high)
    return accepts


def check_trl_values(file: TrlFile, given: Mapping[str, Any], from_file: Mapping[str, Any], gpus: int) -> None:
    """The file's trainer values (``given``: the door's own option values, which win over the file's; ``from_file``:
    the options the file sets; ``gpus``: the GPUs of one machine that train together)."""
    _check_choices(file)
    unit = algorithm(file.algo)
    beta = FIELDS["beta"].metadata["kind"]  # --beta's: a GRPO or RLOO file's beta is that option's, checked as it
    if unit.has_beta and given.get("beta") is None and file.wrote("beta") and not beta.accepts(file.training["beta"]):
        raise _refuse(file, "beta", file.training["beta"], beta.phrase)
    if file.algo == "dpo":
        _check_dpo(file)
    elif file.algo == "kto":
        for key in ("desirable_weight", "undesirable_weight"):
            value = file.training.get(key)
            if file.wrote(key) and not _in_range(0.0, math.inf)(value):
                raise _refuse(file, key, value, "a finite weight, 0 or more, is accepted (a negative one turns "
                                                "that side's loss into a reward)")
    mode = given.get("use_vllm") or from_file.get("use_vllm")
    if unit.groups and mode:
        _check_vllm(file, str(mode), gpus)


def _check_choices(file: TrlFile) -> None:
    """A key whose field declares its values (``choices``, as KTOConfig's ``loss_type``): TRL's parser refuses another
    on its command line, and takes it from a file, for the trainer to fail on later."""
    for key, choices in file.choices.items():
        value = file.training.get(key, file.model.get(key))
        values = value if isinstance(value, list) else [value]
        if file.wrote(key) and value is not None and any(str(item) not in choices for item in values):
            raise _refuse(file, key, value, f"one of {', '.join(choices)} is accepted")


def _dpo_losses(file: TrlFile) -> Tuple[str, ...]:
    losses = file.training.get("loss_type")
    return tuple(str(name) for name in (losses if isinstance(losses, list) else [losses]) if name is not None)


def _check_dpo(file: TrlFile) -> None:
    losses = _dpo_losses(file)
    unknown = [name for name in losses if name not in DPO_LOSS_TYPES]
    if unknown:
        raise _refuse(file, "loss_type", file.written.get("loss_type", file.training.get("loss_type")),
                      f"the loss types DPOTrainer computes, one or a list of: {', '.join(DPO_LOSS_TYPES)}")
    _check_label_smoothing(file, losses)
    divergence = file.training.get("f_divergence_type", "reverse_kl")
    if divergence not in F_DIVERGENCES:
        raise _refuse(file, "f_divergence_type", divergence, f"one of {', '.join(F_DIVERGENCES)} is accepted")
    if divergence != "reverse_kl" and not set(losses) <= set(F_DIVERGENCE_LOSSES):
        raise _refuse(file, "f_divergence_type", divergence,
                      f"DPOTrainer takes another divergence than reverse_kl only for the loss types "
                      f"{', '.join(F_DIVERGENCE_LOSSES)} (loss_type is {', '.join(losses)})")
    if file.training.get("use_weighting") and set(losses) & {"aot", "aot_unpaired"}:
        raise _refuse(file, "use_weighting", True, "false with the aot losses (DPOTrainer does not implement WPO "
                                                   "weighting for losses that sort the samples)")
    ld_alpha = file.training.get("ld_alpha")
    if ld_alpha is not None and not _in_range(0.0, 1.0)(ld_alpha):
        raise _refuse(file, "ld_alpha", ld_alpha, "a number from 0 to 1 is accepted (TRL's DPOConfig: LD-DPO's "
                                                  "weight of the verbose tokens)")
    tau = file.training.get("discopop_tau")
    if "discopop" in losses and not _in_range(0.0, math.inf, low_open=True)(tau):
        raise _refuse(file, "discopop_tau", tau, "a number above 0 is accepted (the discopop loss divides by it)")


# label_smoothing where a loss reads it: (accepts, what is accepted). TRL's DPOConfig says Robust DPO's "must lie in
# [0.0, 0.5)" (its loss divides by 1 - 2x; TRL only warns), DPOTrainer raises for exo_pair at 0.0 (EXO takes log(x)
# and log(1 - x)); the aot losses weigh the two sides by 1 - x and x, a probability.
_SMOOTHING: Dict[str, Tuple[Callable[[Any], bool], str]] = {
    "robust": (_in_range(0.0, 0.5, high_open=True), "from 0 to below 0.5 for the robust loss (a label flipped with "
                                                    "this probability: its loss divides by 1 - 2 x)"),
    "exo_pair": (_in_range(0.0, 1.0, low_open=True, high_open=True),
                 "above 0 and below 1 for the exo_pair loss (EXO's epsilon; TRL refuses its default 0.0 there, and "
                 "the paper suggests 1e-3)"),
    "aot": (_in_range(0.0, 1.0), "a probability from 0 to 1 for the aot losses"),
    "aot_unpaired": (_in_range(0.0, 1.0), "a probability from 0 to 1 for the aot losses"),
}


def _check_label_smoothing(file: TrlFile, losses: Sequence[str]) -> None:
    value = file.training.get("label_smoothing", 0.0)
    for loss in losses:
        if loss in _SMOOTHING and not _SMOOTHING[loss][0](value):
            raise _refuse(file, "label_smoothing", value, _SMOOTHING[loss][1])


def _check_vllm(file: TrlFile, mode: str, gpus: int) -> None:
    """The ``vllm_*`` keys the file writes, where vLLM generates (the file's ``use_vllm``, or ``--use-vllm``); the
    mode and the colocated share are the search's options, checked with them."""
    def written(key: str) -> Optional[Any]:
        return file.training.get(key) if file.wrote(key) else None

    length = written("vllm_max_model_length")
    if length == -1:  # vLLM's own "fit the context to the memory" (its KV cache sizing); not in autofit's ledger
        raise _refuse(file, "vllm_max_model_length", length, "a positive number of tokens here: autofit does not "
                      "model vLLM's -1 (the longest context the memory holds); leave it unset or give the run's "
                      "prompt + completion")
    if length is not None and not (_whole(length) and length >= 1):
        raise _refuse(file, "vllm_max_model_length", length, "a positive number of tokens (vLLM's max_model_len, "
                                                             "prompt + completion) is accepted")
    impl = written("vllm_model_impl")
    if impl is not None and impl not in VLLM_MODEL_IMPLS:
        raise _refuse(file, "vllm_model_impl", impl, f"one of vLLM's {', '.join(VLLM_MODEL_IMPLS)} is accepted")
    parallel = written("vllm_tensor_parallel_size")
    if mode == "colocate" and parallel is not None and not (_whole(parallel) and parallel >= 1 and gpus % parallel
                                                            == 0):
        # TRL's colocated vLLM splits the ranks into groups of this size ("tensor_parallel_size must divide world
        # size"); the probes run one machine's --gpus, so a group wider than a machine cannot be probed here
        raise _refuse(file, "vllm_tensor_parallel_size", parallel,
                      f"a whole number from 1 that divides --gpus {gpus}, the GPUs of a machine that train "
                      "together: colocated vLLM runs in groups of that many training processes")
    if mode == "server":
        for key in ("vllm_server_port", "vllm_group_port"):
            port = written(key)
            if port is not None and not (_whole(port) and 1 <= port <= MAX_PORT):
                raise _refuse(file, key, port, f"a port from 1 to {MAX_PORT} is accepted")
        timeout = written("vllm_server_timeout")
        if timeout is not None and not _in_range(0.0, math.inf)(timeout):
            # TRL's client waits while the time passed is below it: NaN waits forever
            raise _refuse(file, "vllm_server_timeout", timeout, "a finite number of seconds, 0 or more, is accepted")
    sampling = written("vllm_importance_sampling_mode")
    if sampling is not None and file.training.get("vllm_importance_sampling_correction", True) \
            and sampling not in IS_MODES:
        raise _refuse(file, "vllm_importance_sampling_mode", sampling, f"one of {', '.join(IS_MODES)} is accepted")
