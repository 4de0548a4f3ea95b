"""best.yaml (for ``trl <algo> --config``): the chosen candidate as TRL's arguments, each with its comment, or the
user's own file with the changes (``_user_yaml``); and the checkpoint it names for a bundled model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from autofit.core import Candidate, algorithm, as_trained, format_size, one_line, resolve_model
from autofit.core import model_args as knob_model_args
from autofit.export._engine import engine_comments, exported_engine
from autofit.export._user_yaml import user_yaml
from autofit.export._words import why
from autofit.probe.kit import trainable_checkpoint, trainable_folder
from autofit.rungs import ACCELERATE_YAML
from autofit.search import InfrastructureError, SearchReport


def loadable_name(candidate: Candidate) -> str:
    """The model as TRL should load it: a hub id or folder as given; for a bundled toy model without a hub id
    (tiny-qwen2), a random-weight checkpoint of it (the probes loaded a weightless one), which ``write`` builds
    after best.json and best.yaml are written."""
    source = resolve_model(candidate.model)
    if source.local_path or "/" in candidate.model:
        return source.local_path or candidate.model
    return str(trainable_folder(source.config, candidate.model))


def build_trainable(report: SearchReport, out_dir: Path) -> None:
    """The random-weight checkpoint best.yaml names for a bundled toy model, written after the answer: a cache that
    cannot take it (a full disk) is one line, and the same command, which probes nothing again, finishes it."""
    assert report.chosen is not None
    source = resolve_model(report.chosen.candidate.model)
    if source.local_path or "/" in report.chosen.candidate.model:
        return
    try:
        trainable_checkpoint(source.config, report.chosen.candidate.model)
    except (RuntimeError, OSError) as exc:
        raise InfrastructureError(
            f"{out_dir / 'best.json'} and best.yaml are written, but the trainable checkpoint they name could not "
            f"be: {one_line(exc)}; free space in the cache and run the same command again to finish it (it resumes "
            f"from {out_dir})") from None


def model_args(candidate: Candidate, observed: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """TRL ``ModelConfig`` fields: the model as TRL loads it, then the knobs' (LoRA, dtype, quantization, the attention
    implementation the probes measured)."""
    return {"model_name_or_path": loadable_name(candidate), **knob_model_args(candidate, observed)}


def training_args(candidate: Candidate) -> Dict[str, Any]:
    """The candidate's training arguments as best.yaml writes them: the attention kernel is ModelConfig's
    ``attn_implementation`` there (TRL's script puts it in ``model_init_kwargs``), not a second copy."""
    args = candidate.training_args()
    init = args.get("model_init_kwargs")
    if candidate.attn_implementation is not None and isinstance(init, dict):
        init = {k: v for k, v in init.items() if k != "attn_implementation"}
        if init:
            args["model_init_kwargs"] = init
        else:
            args.pop("model_init_kwargs")
    return args


def usage(algo: str, offload: Optional[str] = None, written: Tuple[str, ...] = ()) -> str:
    """How the answer runs; ``written``: the keys of the user's own file, which may name the data and rewards."""
    unit = algorithm(algo)
    if unit.trl_command is None:
        return unit.usage or f"# build {unit.config_class.rsplit(':', 1)[-1] or 'your config'}(**best.json['config'])"
    engine = f" --accelerate_config {ACCELERATE_YAML}" if offload else ""
    data = "" if {"dataset_name", "datasets"} & set(written) else " --dataset_name YOUR_DATASET"
    rewards = ""  # TRL's grpo and rloo commands need a reward: a function of the registry or a module's, or a model
    if unit.groups and not {"reward_funcs", "reward_model_name_or_path"} & set(written):
        rewards = " --reward_funcs YOUR_REWARD"
    return f"# use: trl {unit.trl_command} --config best.yaml{engine}{data}{rewards}"


def _scalar(value: Any) -> str:
    """One YAML line: strings double-quoted, in UTF-8; escaped (JSON's, YAML's \\U) only what cannot stand as it is."""
    if isinstance(value, str):  # an emoji as it is: JSON's \ud83d\ude80 load in YAML as two lone surrogates
        return "".join(c if c.isprintable() else f"\\U{ord(c):08x}" for c in json.dumps(value, ensure_ascii=False))
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip().removesuffix("...").strip()


def user_file(report: SearchReport) -> Tuple[str, List[Dict[str, Any]]]:
    """best.yaml as the user's own config file with the answer's changes, and the changes (``--config``)."""
    fit, spec = report.chosen, report.spec
    assert fit is not None and report.verified is not None and spec.options.config
    observed = report.verified.observed or fit.result.observed or {}
    candidate = as_trained(fit.candidate, observed)
    exported = {**model_args(candidate, observed), **training_args(candidate)}
    assert spec.launch.file is not None  # the door read the file
    return user_yaml(spec.launch.file, candidate, exported,
                     lambda key: why(key, candidate, spec.max_length, spec.options.maximize), _header(report))


def _header(report: SearchReport) -> List[str]:
    fit, spec = report.chosen, report.spec
    assert fit is not None and report.verified is not None
    candidate = fit.candidate
    written: Tuple[str, ...] = ()
    if spec.launch.file is not None:
        written = tuple(spec.launch.file.written)
    lines = [
        f"# autofit: best {one_line(spec.options.algo)} configuration for {one_line(spec.options.model)} within "
        f"{format_size(spec.budget_bytes)}",
        f"# verified peak {format_size(report.verified.peak_bytes)} over {report.verified.steps} steps; "
        f"rungs: {', '.join(candidate.rungs) or 'none'}",
        usage(one_line(spec.options.algo), exported_engine(report), written),
    ]
    lines += engine_comments(report, candidate)
    if candidate.is_rl and candidate.prompt_length:
        lines.append(f"# measured with prompts of {candidate.prompt_length} tokens: TRL {one_line(spec.options.algo)} "
                     "does not truncate prompts, so keep yours this short (or search with --max-prompt-length)")
    return lines


def yaml_text(report: SearchReport) -> str:
    fit, spec = report.chosen, report.spec
    assert fit is not None and report.verified is not None  # written for a fit only, and a fit is verified
    if spec.options.config:
        return user_file(report)[0]
    candidate = as_trained(fit.candidate, report.verified.observed or fit.result.observed)
    defaults = fit.result.config_defaults or report.verified.config_defaults
    train = {k: v for k, v in training_args(candidate).items() if k not in defaults or defaults[k] != v}
    lines = _header(report)
    observed = report.verified.observed or fit.result.observed or {}
    for key, value in {**model_args(candidate, observed), **train}.items():
        lines.append(f"{key}: {_scalar(value)}  "
                     f"# {one_line(why(key, candidate, spec.max_length, spec.options.maximize))}")
    if candidate.env:
        lines.append("env:")
        for key, value in candidate.env:
            lines.append(f"  {key}: {_scalar(value)}  "
                         f"# {one_line(why(f'env.{key}', candidate, spec.max_length, spec.options.maximize))}")
    return "\n".join(lines) + "\n"
