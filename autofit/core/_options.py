"""Every option of a search, declared once: its name, help text, type, default and check live in one field of
``SearchOptions``, from which ``autofit search``, ``autofit estimate`` and ``autofit.fit`` are derived
(``options_parser``; ``fit``'s keywords are the fields its door takes); best.json records the request as these fields,
after TRL's config dataclasses. A field's kind both parses the command line's text and checks a Python value, so the
two doors cannot accept different things. Checks across fields at every door are ``SearchOptions.check``; what needs
the machine (the device, the card's memory, the GPUs) or the ladder is resolved later, into a ``SearchSpec``.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from autofit.core._algorithms import DEFAULT_ALGO, algorithm, algorithm_names, or_list
from autofit.core._errors import InputError
from autofit.core._kinds import (
    ARGS,
    BETA,
    DEVICE_IDS,
    FLAG,
    FOLDER,
    GENERATIONS,
    GPUS,
    HEADROOM,
    LADDER,
    POSITIVE_INT,
    PROBE_STEPS,
    SECONDS,
    SHARE,
    SIZE,
    TEXT,
    VERIFY_STEPS,
    WORDS,
    WORKERS,
    Kind,
    one_of,
)
from autofit.core._kinds import AUTO_VERIFY as AUTO_VERIFY  # re-exported: the spec's verification plan reads it
from autofit.core._secrets import masked
from autofit.core._sizes import card_names

SEARCH, ESTIMATE, FIT = "search", "estimate", "fit"
DOORS = (SEARCH, ESTIMATE, FIT)
DEVICES = ("auto", "cuda", "cpu")
DTYPES = ("auto", "bfloat16", "float16", "float32")  # TRL's ModelConfig.dtype choices
MAXIMIZE = ("batch", "length")
VLLM_MODES = ("colocate", "server")
GROUP_ALGOS = algorithm_names(groups=True)  # algorithms that sample num_generations completions per prompt
RL_GROUP = or_list(algorithm_names(rl=True), "and")
SEQUENCE_ALGOS = or_list(algorithm_names(rl=False), "and")  # the algorithms whose searched length is --max-length


def option(default: Any = MISSING, *, help: str, kind: Kind, doors: Iterable[str] = (SEARCH, FIT),
           flags: Sequence[str] = (), group: Optional[str] = None, metavar: Optional[str] = None,
           required: Iterable[str] = (), estimate_help: Optional[str] = None) -> Any:
    """A field of ``SearchOptions``: ``flags`` default to ``--name-with-dashes``; a ``FLAG`` kind is a switch on the
    command line (``--no-x`` where the default is True); ``required`` names the command-line doors that need it."""
    metadata = dict(help=help, kind=kind, doors=frozenset(doors), flags=tuple(flags), group=group, metavar=metavar,
                    required=frozenset(required), estimate_help=estimate_help)
    return field(default=None if default is MISSING else default, metadata=metadata)


@dataclass(frozen=True)
class SearchOptions:
    """What a user asks for, as they wrote it (the fields are ``autofit search``'s options and ``fit``'s keywords)."""

    model: str = option(help="hub id (bundled configs work offline) or local folder (default: --config's "
                             "model_name_or_path)", kind=TEXT, doors=DOORS)
    algo: str = option(DEFAULT_ALGO, help=f"the TRL trainer: {or_list(algorithm_names())} (default {DEFAULT_ALGO})",
                       kind=TEXT, doors=DOORS,
                       estimate_help=f"{or_list(algorithm_names(estimated=True))} (default {DEFAULT_ALGO})")
    config: Optional[str] = option(
        help="your TRL config file (as trl sft --config FILE reads it): its run is where the search starts, and "
             "best.yaml is that file with the changes fitting needed; flags given here override it", kind=TEXT,
        doors=DOORS, metavar="FILE")
    accelerate_config: Optional[str] = option(
        help="your accelerate config file, as accelerate launch --config_file FILE reads it (or one of TRL's names: "
             "zero3, fsdp2, ...): its engine (DeepSpeed, FSDP), mixed precision, processes and machines are your "
             "run's; it wins over --config's accelerate_config", kind=TEXT, doors=DOORS, metavar="FILE")
    launch_args: Optional[Tuple[str, ...]] = option(
        help="the words of your launch after its config file (autofit search -- trl sft --config F.yaml --flag v): "
             "TRL's parser reads them over the file, as trl does; only the -- door sets them", kind=WORDS, doors=())
    factory: Optional[str] = option(help="probe your own trainer: a function that builds it from a candidate (see "
                                         "autofit.fit)", kind=TEXT, doors=(SEARCH,), metavar="MODULE:FUNCTION")
    gpu_memory: Union[None, str, int] = option(
        help=f"budget per GPU: a size (24GiB; 80GB is 10^9 bytes, 74.51 GiB) or a card's name, its whole memory "
             f"({card_names()}); default the card's memory; required on CPU", kind=SIZE, doors=DOORS,
        required=(ESTIMATE,),
        estimate_help=f"budget per GPU: a size (24GiB, 80GB) or a card's name ({card_names()}); a card prints its "
                      "predicted tokens/s; several, comma-separated (H100,L4), are compared")
    device: str = option("auto", help="auto, cuda or cpu (cpu: the simulated device meter)", kind=one_of(DEVICES),
                         doors=DOORS, estimate_help="cuda (a GPU with bf16 autocast and a CUDA context; auto is cuda "
                                                    "here) or cpu (the simulated meter)")
    max_length: Optional[int] = option(help=f"sequence length: {SEQUENCE_ALGOS} (default 1024)", kind=POSITIVE_INT,
                                       doors=DOORS)
    min_length: Optional[int] = option(help=f"floor for shorter sequences, {SEQUENCE_ALGOS} (default: never cut)",
                                       kind=POSITIVE_INT, doors=DOORS)
    max_completion_length: Optional[int] = option(help="completion (ppo: response) length (default 512)",
                                                  kind=POSITIVE_INT, doors=DOORS, group=RL_GROUP)
    min_completion_length: Optional[int] = option(help="floor for shorter completions", kind=POSITIVE_INT,
                                                  doors=DOORS, group=RL_GROUP)
    max_prompt_length: int = option(128, help="synthetic prompt length (128)", kind=POSITIVE_INT, doors=DOORS,
                                    group=RL_GROUP)
    num_generations: Optional[int] = option(help="completions per prompt (default: TRL's)", kind=GENERATIONS,
                                            doors=DOORS, group=RL_GROUP)
    use_vllm: Optional[str] = option(
        help="vLLM generates: colocate (in each training process) or server (trl vllm-serve elsewhere); probed where "
             "vLLM is installed, estimated where not", kind=one_of(VLLM_MODES), doors=DOORS, group=RL_GROUP,
        metavar="MODE")
    vllm_gpu_memory_utilization: float = option(0.3, help="colocate: the share of each GPU vLLM takes (TRL's default "
                                                          "0.3)", kind=SHARE, doors=DOORS, group=RL_GROUP)
    beta: Optional[float] = option(help="KL coefficient (grpo, rloo, dpo, kto); > 0 loads and measures the reference "
                                        "model", kind=BETA, doors=DOORS, group=RL_GROUP)
    effective_batch: int = option(8, help="micro-batch x accumulation x GPUs, kept exactly (default 8)",
                                  kind=POSITIVE_INT, doors=DOORS)
    gpus: Union[int, str] = option(
        1, help="GPUs on this machine that train together, a number or 'all' (default 1): each probe runs one process "
                "per GPU through accelerate, and the sharding rungs (ZeRO, FSDP2) apply", kind=GPUS, doors=DOORS,
        estimate_help="GPUs that train together (default 1): the per-GPU ledger of data parallel and of each sharding "
                      "rung (ZeRO-1/2/3, FSDP2)")
    nodes: int = option(1, help="machines to export for (default 1): the probes run this machine's --gpus; the "
                                "accelerate config is written for all of them, with the ledger's per-GPU figure",
                        kind=POSITIVE_INT, doors=DOORS,
                        estimate_help="machines, each with --gpus GPUs: the ledger at world size GPUs x nodes")
    host_cores: Optional[int] = option(help="CPU cores of each machine, which its ranks share for an offloaded "
                                            "optimizer step (default: this machine's on a GPU, else 8 a GPU)",
                                       kind=POSITIVE_INT, doors=DOORS)
    gpus_for_probes: Optional[Sequence[int]] = option(
        help="run probes side by side, one per GPU of these (e.g. 0,1,2,3; a candidate of --gpus k takes k of them): "
             "the probes the walk may ask for next start on free GPUs, the answer is the one-at-a-time search's, "
             "verifications run alone (default: one probe at a time; on --device cpu the indices name simulated "
             "devices, each probe with its own meter and budget)", kind=DEVICE_IDS, metavar="IDS")
    workers: Optional[int] = option(
        help="hand probes out to N `autofit worker` processes (on this machine or others) instead of running them "
             "here: up to N probes at once, as --gpus-for-probes, through the queue in --worker-queue",
        kind=WORKERS, metavar="N")
    worker_queue: Optional[str] = option(
        help="where the workers take probes from (their --study): a folder on a filesystem they share that only you "
             "can write to, redis://HOST:PORT or postgresql://USER@HOST/DB, the password in $AUTOFIT_QUEUE_PASSWORD or "
             "the file $AUTOFIT_QUEUE_PASSWORD_FILE (default: the --out folder)", kind=TEXT,
        metavar="DIR_OR_URL")
    worker_silence_s: float = option(
        60.0, help="seconds without a worker's heartbeat after which its probe is handed out again (default 60)",
        kind=SECONDS, flags=("--worker-silence",))
    maximize: str = option("batch", help="batch (default) or length (longest that fits)", kind=one_of(MAXIMIZE),
                           doors=DOORS)
    ladder: Union[None, str, Sequence[str]] = option(
        help="comma-separated rung names, in order (default: the whole ladder)", kind=LADDER, doors=DOORS)
    out_dir: Path = option("autofit-out", help="output folder; the study there is resumed", kind=FOLDER,
                                       flags=("--out",))
    real_weights: bool = option(False, help="load the model's weights instead of random", kind=FLAG)
    dtype: Optional[str] = option(help="load the weights in this dtype (auto, bfloat16, float16, float32), as TRL's "
                                       "--dtype; default: float32 (TRL's), bfloat16 only as a rung",
                                  kind=one_of(DTYPES))
    probe_steps: int = option(2, help="optimizer steps per probe (>= 2)", kind=PROBE_STEPS)
    verify_steps: Union[int, str] = option(
        AUTO_VERIFY, help="optimizer steps of the check run, or auto (default): at least 3, at most 10, stopping "
                          "after 60 s of training", kind=VERIFY_STEPS)
    probe_timeout_s: float = option(900.0, help="seconds before a probe is killed (default 900)", kind=SECONDS,
                                    flags=("--probe-timeout",))
    build_timeout_s: float = option(600.0, help="seconds the trainer factory may take to build the trainer (default "
                                                "600)", kind=SECONDS, flags=("--build-timeout",))
    max_probes: Optional[int] = option(
        help="stop probing after N probes and choose: the study's total in --out, earlier runs' probes included, so "
             "running a finished search again spends nothing", kind=POSITIVE_INT)
    headroom: Optional[float] = option(help="fraction of the budget kept free (default 0.03 on CUDA)", kind=HEADROOM)
    predict: bool = option(True, help="probe without the memory model: no predicted start, no skipped candidates",
                           kind=FLAG, flags=("--no-predict",))
    trust_remote_code: bool = option(
        False, help="run the model's own code (auto_map in config.json) in probes, as TRL's flag of that name",
        kind=FLAG, doors=DOORS, estimate_help="estimate a model that needs its own code (auto_map) from its "
                                              "configuration")
    allow_busy_gpu: bool = option(False, help="search within the memory other processes leave free (default: exit 2 "
                                              "when it is less than the budget)", kind=FLAG)
    quiet: bool = option(False, help="only the final table", kind=FLAG, flags=("-q", "--quiet"))
    training_args: Optional[Dict[str, Any]] = option(
        help="your own config fields, passed through (the fields autofit searches are the candidate's)", kind=ARGS,
        doors=(FIT,))
    from_dir: Optional[str] = option(help="use the calibrated memory model of an earlier search (DIR/best.json, key "
                                          "memory_model)", kind=TEXT, doors=(ESTIMATE,), flags=("--from",),
                                     metavar="DIR")
    plot: Optional[str] = option(help="also draw the ledger of every level against the budget (.svg, .png or .pdf)",
                                 kind=TEXT, doors=(ESTIMATE,), metavar="FILE")
    wide: bool = option(False, help="each ledger term a column of the table", kind=FLAG, doors=(ESTIMATE,))
    as_json: bool = option(False, help="print the answer, its files, the commands to run next and the exit reason as "
                                       "one JSON document on stdout, progress on stderr (schema: docs/cli.md)",
                           kind=FLAG, doors=(SEARCH, ESTIMATE), flags=("--json",),
                           estimate_help="print the whole estimate as one JSON document on stdout (schema: "
                                         "docs/cli.md)")

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value is not None and not spec.metadata["kind"].accepts(value):
                raise refused(spec.name, value)
        if self.model is None:
            raise InputError("--model is required: a hub id or a local folder (or model_name_or_path in --config)")
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        object.__setattr__(self, "launch_args", tuple(self.launch_args) if self.launch_args else None)
        self.check()

    def check(self) -> None:
        """What must hold between the options at every door (one line naming the option that breaks it)."""
        unit = algorithm(self.algo)
        rl = unit.rl
        if rl and (self.max_length is not None or self.min_length is not None):
            raise InputError(f"--max-length/--min-length do not apply to {self.algo}: use --max-completion-length "
                             "and --min-completion-length")
        with_beta = " and ".join(algorithm_names(has_beta=True))
        if rl and unit.kl_field and self.beta is not None:
            raise InputError(f"--beta applies to {with_beta}; {self.algo.upper()}'s KL coefficient is "
                             f"{unit.config_class.rsplit(':', 1)[-1]}.{unit.kl_field}")
        if not rl:
            given = [name for name in ("max_completion_length", "min_completion_length") + (() if unit.has_beta
                                                                                         else ("beta",))
                     if getattr(self, name) is not None]
            if given:
                raise InputError(f"{flag(given[0])} applies to {with_beta}, not to '{self.algo}'")
        for name in ("num_generations", "use_vllm"):
            if getattr(self, name) is not None and self.algo not in GROUP_ALGOS:
                raise InputError(f"{flag(name)} applies to {' and '.join(GROUP_ALGOS)}, not to '{self.algo}'")
        if self.num_generations is not None and self.effective_batch % self.num_generations:
            raise InputError(f"--effective-batch {self.effective_batch} cannot be divided into groups of "
                             f"--num-generations {self.num_generations}: use a multiple of {self.num_generations}")
        if self.workers is not None and self.gpus_for_probes:
            raise InputError("--workers and --gpus-for-probes both say where probes run: give one (a worker has "
                             "--gpus-for-probes of its own)")
        if self.worker_queue is not None and self.workers is None:
            raise InputError(f"--worker-queue {masked(self.worker_queue)} applies with --workers N: give the number of "
                             "workers")
        if self.dtype is not None and unit.config_class and not unit.model_init_kwargs:
            raise InputError(f"--dtype does not apply to {self.algo}: {unit.config_class.rsplit(':', 1)[-1]} has no "
                             f"model_init_kwargs; load the models in the dtype you want in your {self.algo.upper()} "
                             "script")

    @property
    def length(self) -> int:
        """The length the search starts from: the sequence for sft and reward, the completion for RL."""
        if algorithm(self.algo).rl:
            return self.max_completion_length or 512
        return self.max_length or 1024

    @property
    def length_floor(self) -> int:
        """How short the shorter-length rung may go: never below the length unless asked (``--maximize length``:
        128, or the length when it is shorter)."""
        floor = self.min_completion_length if algorithm(self.algo).rl else self.min_length
        if floor is None:
            floor = self.length if self.maximize == "batch" else min(self.length, 128)
        if floor > self.length:
            given = "--min-completion-length" if algorithm(self.algo).rl else "--min-length"
            upper = "--max-completion-length" if algorithm(self.algo).rl else "--max-length"
            raise InputError(f"{given} {floor} is above {upper} {self.length}: it must be at most that")
        return floor

    def record(self) -> Dict[str, Any]:
        """The request as best.json keeps it: every option the user's door takes, JSON-safe."""
        data = asdict(self)
        data["out_dir"] = str(self.out_dir)
        if self.worker_queue is not None:
            data["worker_queue"] = masked(self.worker_queue)  # best.json is 0644: never a password
        if isinstance(self.ladder, tuple):
            data["ladder"] = list(self.ladder)
        return data


def refused(name: str, value: Any) -> InputError:
    kind = FIELDS[name].metadata["kind"]
    words = (kind.explain(value) if kind.explain else None) or kind.phrase
    return InputError(f"{flag(name)} {masked(repr(value))} is not valid: {words}")


def flag(name: str) -> str:
    """The name every message gives a field: its command-line flag (fit's keyword is the field's name), or the
    keyword of an option only ``fit`` takes."""
    spec = FIELDS[name]
    if spec.metadata["doors"] == {FIT}:
        return name
    return spec.metadata["flags"][-1] if spec.metadata["flags"] else "--" + name.replace("_", "-")


FIELDS = {spec.name: spec for spec in fields(SearchOptions)}


def door_fields(door: str) -> List[str]:
    """The options one door takes, in declaration order."""
    return [name for name, spec in FIELDS.items() if door in spec.metadata["doors"]]


def add_options(parser: argparse.ArgumentParser, door: str) -> None:
    """Add a command-line door's options to ``parser``, each from its field (help, type, default, group)."""
    groups: Dict[str, Any] = {}
    for name in door_fields(door):
        meta = FIELDS[name].metadata
        default = FIELDS[name].default
        target = parser
        if meta["group"]:
            target = groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        help_text = (meta["estimate_help"] if door == ESTIMATE and meta["estimate_help"] else meta["help"])
        flags = meta["flags"] or ("--" + name.replace("_", "-"),)
        if meta["kind"] is FLAG:
            target.add_argument(*flags, dest=name, action="store_false" if default else "store_true", help=help_text)
            continue
        target.add_argument(*flags, dest=name, default=None, help=help_text, metavar=meta["metavar"],
                            required=door in meta["required"])


def options_from_args(args: argparse.Namespace, door: str) -> SearchOptions:
    """The options of a parsed command line."""
    return SearchOptions(**given_values(args, door))


def given_values(args: argparse.Namespace, door: str) -> Dict[str, Any]:
    """The options a command line was given: each text read by its field's kind, and refused with the message the
    ``fit`` door gives for the same value (the text quoted as it was typed); switches as they stand."""
    values: Dict[str, Any] = {}
    for name in door_fields(door):
        text = getattr(args, name, None)
        if text is None or isinstance(text, bool):  # not given (the field's default), or a switch
            if isinstance(text, bool):
                values[name] = text
            continue
        kind = FIELDS[name].metadata["kind"]
        try:
            value = kind.parse(text) if kind.parse else text
        except (TypeError, ValueError):
            raise refused(name, text) from None
        if not kind.accepts(value):
            raise refused(name, text)
        values[name] = value
    return values


def ladder_names(ladder: Union[None, str, Sequence[str]]) -> Optional[List[str]]:
    """A ladder given as "name,name" (the command line's form) or as a list of rung names."""
    if ladder is None:
        return None
    names = [name.strip() for name in ladder.split(",")] if isinstance(ladder, str) else list(ladder)
    names = [name for name in names if name]
    if not names:
        raise InputError(f"--ladder {ladder!r} names no rung")
    return names

