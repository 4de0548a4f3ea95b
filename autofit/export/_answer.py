"""The search's answer, derived once: the candidate as it was trained (what the user's own trainer adds, read back in
the probe), its keys as TRL takes them with best.yaml's comment on each, the keys that differ from the config class's
defaults, the trades, the engine's files and launch line, host memory, and the changes to the user's own file.
best.yaml, best.json's answer and the terminal's summary are renderings of this one value (report.html renders
best.json); a new output format is one more renderer, never another derivation."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from autofit import memory_model
from autofit.core import KNOBS, TRL_KEYS, Candidate, as_trained, blocks, format_size, one_line
from autofit.export._engine import engine_comments, engine_data, exported_engine, host_memory_data
from autofit.export._user_yaml import user_yaml
from autofit.export._vllm import vllm_comments, vllm_data
from autofit.export._words import trades, train_command, usage, was, why
from autofit.machine import resolve_model
from autofit.probe.kit import trainable_folder
from autofit.rungs import ACCELERATE_YAML
from autofit.search import SearchReport


@dataclass(frozen=True)
class Answer:
    candidate: Candidate  # as trained: the user's own trainer's LoRA, quantized base, generations
    observed: Dict[str, Any]  # what the probes' trainer ran (the attention it loaded, ...)
    model_args: Dict[str, Any]  # ModelConfig's keys, as best.yaml writes them
    training_args: Dict[str, Any]  # the config class's keys, as best.yaml writes them
    config: Dict[str, Any]  # the config class's keyword arguments (best.json's ``config``)
    written: Dict[str, Any]  # what best.yaml writes from the model's arguments and the training arguments' changes
    comments: Dict[str, str]  # best.yaml's comment on each key it writes (``env.NAME`` for the env block's)
    header: List[str]  # best.yaml's comment lines above the keys
    trades: List[str]
    blocks: Dict[str, Optional[Dict[str, Any]]]  # best.json's peft and quantization, in the libraries' names
    engine: Optional[Dict[str, Any]]
    host_memory: Optional[Dict[str, Any]]
    vllm: Optional[Dict[str, Any]]  # vLLM's share, predicted and measured (GRPO and RLOO with --use-vllm)
    user_text: Optional[str] = None  # best.yaml as the user's own file with the changes (``--config``)
    changes: Optional[List[Dict[str, Any]]] = None
    env: Tuple[Tuple[str, str], ...] = field(default=())
    train: Optional[str] = None  # the command that trains it, the out folder's paths absolute (None: no trl command)


def loadable_name(candidate: Candidate) -> str:
    """The model as TRL should load it: a hub id or folder as given; for a bundled toy model without a hub id
    (tiny-qwen2), a random-weight checkpoint of it (the probes loaded a weightless one), which ``write`` builds
    after best.json and best.yaml are written."""
    source = resolve_model(candidate.model)
    if source.local_path or "/" in candidate.model:
        return source.local_path or candidate.model
    return str(trainable_folder(source.config, candidate.model))


def knob_model_args(candidate: Candidate, observed: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """ModelConfig's arguments of the candidate (best.yaml's; ``observed``: what the probes' trainer ran)."""
    args: Dict[str, Any] = {}
    for k in KNOBS:
        args.update(k.model(candidate, observed or {}))
    return args


def model_args(candidate: Candidate, observed: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """TRL ``ModelConfig`` fields: the model as TRL loads it, then the knobs' (LoRA, dtype, quantization, the attention
    implementation the probes measured)."""
    return {"model_name_or_path": loadable_name(candidate), **knob_model_args(candidate, observed)}


def training_args(candidate: Candidate) -> Dict[str, Any]:
    """The candidate's training arguments as best.yaml writes them: the attention kernel is ModelConfig's
    ``attn_implementation`` there (TRL's script puts it in ``model_init_kwargs``), not a second copy."""
    args = candidate.training_args()
    init = args.get(TRL_KEYS.init_kwargs)
    if candidate.attn_implementation is not None and isinstance(init, dict):
        init = {k: v for k, v in init.items() if k != "attn_implementation"}
        if init:
            args[TRL_KEYS.init_kwargs] = init
        else:
            args.pop(TRL_KEYS.init_kwargs)
    return args


def answer(report: SearchReport, out_dir: Optional[Path] = None) -> Optional[Answer]:
    """The answer of a search that found a fit (None where nothing fits)."""
    fit, verified, spec = report.chosen, report.verified, report.spec
    if not report.fits:
        return None
    assert fit is not None and verified is not None  # a fit is verified
    observed = verified.observed or fit.result.observed or {}
    candidate = as_trained(fit.candidate, observed)
    model, training = model_args(candidate, observed), training_args(candidate)
    defaults = fit.result.config_defaults or verified.config_defaults
    written = {**model, **{k: v for k, v in training.items() if k not in defaults or defaults[k] != v}}

    def comment(key: str) -> str:
        return one_line(why(key, candidate, spec.max_length, spec.options.maximize))

    before = _users_run(report, observed, candidate)
    comments = {}
    for key, value in {**written, **{f"env.{k}": v for k, v in candidate.env}}.items():
        changed = was(key, value, before, defaults or {})
        comments[key] = f"{comment(key)}; {changed}" if changed else comment(key)
    answered = Answer(
        candidate=candidate, observed=observed, model_args=model, training_args=training,
        config=candidate.training_args(), written=written, comments=comments,
        header=_header(report, candidate, model["model_name_or_path"]),
        trades=trades(candidate, spec.max_length, memory_model.shape_or_none(spec.options.model)),
        blocks=blocks(candidate), engine=engine_data(report, candidate, out_dir),
        host_memory=host_memory_data(report, candidate),
        vllm=vllm_data(report, candidate, model["model_name_or_path"]), env=candidate.env,
        train=_train(report, out_dir))
    if spec.launch.file is None:
        return answered
    text, changes = user_yaml(spec.launch.file, candidate, {**model, **training}, comment, answered.header)
    return Answer(**{**answered.__dict__, "user_text": text, "changes": changes})


def _users_run(report: SearchReport, observed: Dict[str, Any], trained: Candidate) -> Dict[str, Any]:
    """The keys the user's run exports (the ladder's first level: their file's run, or the question as asked, with
    what their own trainer adds), ``env.NAME`` for its environment: what best.yaml says a changed key was.
    ``trained``: the answer as trained, which is the user's run where the search chose the first level's."""
    if not report.levels:
        return {}
    assert report.chosen is not None
    first = report.levels[0].candidate
    start = trained if first == report.chosen.candidate else as_trained(first, observed)
    return {**model_args(start, observed), **training_args(start), **{f"env.{k}": v for k, v in start.env}}


def _train(report: SearchReport, out_dir: Optional[Path]) -> Optional[str]:
    spec = report.spec
    folder = Path(out_dir or spec.options.out_dir).resolve()
    written = tuple(spec.launch.file.written) if spec.launch.file is not None else ()
    return train_command(spec.options.algo, exported_engine(report), written, shlex.quote(str(folder / "best.yaml")),
                         shlex.quote(str(folder / ACCELERATE_YAML)))


def _header(report: SearchReport, candidate: Candidate, model: str) -> List[str]:
    spec, verified = report.spec, report.verified
    assert verified is not None
    written = tuple(spec.launch.file.written) if spec.launch.file is not None else ()
    lines = [
        f"# autofit: best {one_line(spec.options.algo)} configuration for {one_line(spec.options.model)} within "
        f"{format_size(spec.budget_bytes)}",
        f"# verified peak {format_size(verified.peak_bytes)} over {verified.steps} steps; "
        f"rungs: {', '.join(candidate.rungs) or 'none'}",
        usage(one_line(spec.options.algo), exported_engine(report), written),
    ]
    lines += engine_comments(report, candidate) + vllm_comments(report, candidate, model)
    if candidate.is_rl and candidate.prompt_length:
        lines.append(f"# measured with prompts of {candidate.prompt_length} tokens: TRL {one_line(spec.options.algo)} "
                     "does not truncate prompts, so keep yours this short (or search with --max-prompt-length)")
    return lines
