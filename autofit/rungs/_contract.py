"""The rung contract: everything a rung is, in one object, and where the stages find it.

Like an Optuna sampler behind ``BaseSampler``, a rung is one class. Beside ``name``, ``cost``, ``help`` and
``apply(state) -> state | None`` (the ``Rung`` protocol of ``autofit.rungs._ladder``) it may carry, each part
optional with a default in ``RungBase``:

- its words: ``trade(candidate, context)`` (the sentence of best.json's ``trades`` and the notes), ``comment(key,
  candidate)`` (best.yaml's comment on a key it changes);
- its probe step: ``probe_step``, a ``"module:attribute"`` path to a ``ProbeStep`` that the probe's child process
  imports (what the child does before the trainer is built, around training, and what it reads back);
- its ledger effect: ``ledger(terms, candidate, model)`` over the memory model's terms (``model``: the facts of the
  candidate's model a ledger may need, ``ModelFacts``), or ``band``, the error band of a rung the memory model does
  not describe (``modelled``: the built-ins, whose effect it reads from the candidate's fields); its speed effect:
  ``speed(seconds, candidate, model)`` over the throughput model's seconds of a step by part (``"forward"``,
  ``"optimizer"``, ...; a part of its own by a name of its own);
- what it needs to run: ``unavailable(device)``, the reason it is left out on this machine, said once; and
  ``host_memory``, what it keeps in host memory in words ("offloaded states"), with ``host_bytes(candidate, model)``,
  how much: the search checks the machine's available RAM against it before any probe.

The stages read these from the rung (``rung_named``), never from a table keyed by rung names. A rung of another
package is found through the ``autofit.rungs`` entry point group and has the powers of a built-in.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, FrozenSet, Iterable, Mapping, Optional, Protocol, Sequence, Tuple

from autofit.core import KNOBS, Candidate, Knob, Outcome, keys_of


def knob(name: str) -> Knob:
    """The knob table's entry of that name (what a rung turns: its fields, its keys)."""
    return next(k for k in KNOBS if k.name == name)


class ModelFacts(Protocol):
    """What the memory model tells a rung's ``ledger`` and ``host_bytes`` about the candidate's model (on the device it
    is asked for), handed in, so that a rung (another package's too) needs no name of the memory model's."""

    parameters: int  # every parameter of the model the algorithm trains
    parameter_shapes: Sequence[Tuple[Tuple[int, ...], int]]  # (shape, how many such tensors) of every parameter
    trainable_tensors: Sequence[Tuple[int, int]]  # (elements, how many such tensors) of what the candidate trains
    weight_bytes: int  # bytes per element of the loaded (non-quantized) weights

    def optimizer_state_bytes(self, optim: Optional[str], param_bytes: int) -> float:
        """The memory model's bytes of ``optim``'s states for the trained tensors (its table; two fp32 states for
        an optimizer it does not know)."""

    # What the memory model puts in host memory for the candidate, whichever rung keeps it there (bytes):
    offloaded_optimizer_bytes: float  # the optimizer DeepSpeed ZeRO-2 would offload (fp32 states, pinned weights)
    offloaded_shard_bytes: float  # the shards of an offloading sharding (ZeRO-3's or FSDP2's parameter offload)
    offloaded_activation_bytes: float  # the saved activations TRL's activation offloading keeps there


class RungBase:
    """Defaults for the optional parts of a rung: subclass it, or follow ``Rung`` and define only what you need."""

    name: str = ""
    cost: str = ""
    help: str = ""
    # -- words ------------------------------------------------------------------------------------------------
    trade_text: str = ""  # what the user trades for this rung, one sentence ("" says nothing)
    # the knobs whose keys it writes (``autofit.core._knob_table``): best.yaml's comment on each is ``knob_comment``
    knobs: Tuple[str, ...] = ()
    knob_comment: str = ""  # "": the rung's name
    key_comments: Mapping[str, str] = {}  # config key -> best.yaml's comment, where one key needs its own
    # -- probe step -------------------------------------------------------------------------------------------
    probe_step: Optional[str] = None  # "module:attribute" of a ProbeStep, imported in the probe's child only
    # -- ledger -----------------------------------------------------------------------------------------------
    band: Optional[float] = None  # not modelled: the memory model's error band for a candidate with this rung
    # the memory model describes its effect from the candidate's fields (the built-in rungs): no band, no note
    modelled: bool = False
    # why its level's first candidate is priced as the level before it ("": it is not): the rung changes what the
    # search then varies (the batch, the length), or what it buys shows only where the run needs it
    priced_by_its_search: str = ""
    # -- needs ------------------------------------------------------------------------------------------------
    host_memory: str = ""  # what it keeps in host memory, in words ("": nothing): RAM checked before probing
    # -- its place in the ladder --------------------------------------------------------------------------------
    runs_an_engine: bool = False  # it runs an engine of autofit's own (DeepSpeed, FSDP): it would replace the user's
    alternative_to: Tuple[str, ...] = ()  # rungs it may stand in for: a fit is also tried without them (pruning)

    def apply(self, state: Any) -> Any:  # pragma: no cover - every rung has its own
        raise NotImplementedError

    def trade(self, candidate: Candidate, context: Mapping[str, Any]) -> Optional[str]:
        """What the user trades for this rung in ``candidate`` (``context``: the asked length, the model's shape)."""
        return self.trade_text or None

    def comment(self, key: str, candidate: Candidate) -> Optional[str]:
        """best.yaml's comment on ``key`` when this rung wrote it; None: not this rung's key."""
        if key in self.key_comments:
            return self.key_comments[key]
        return (self.knob_comment or self.name) if key in keys_of(*self.knobs) else None

    def ledger(self, terms: Dict[str, int], candidate: Candidate, model: ModelFacts) -> Dict[str, int]:
        """The memory model's terms with this rung's effect (built-ins are read from the candidate's fields)."""
        return terms

    def speed(self, seconds: Dict[str, float], candidate: Candidate, model: ModelFacts) -> Dict[str, float]:
        """The throughput model's seconds of an optimizer step by part, with this rung's effect (built-ins are read
        from the candidate's fields)."""
        return seconds

    def host_bytes(self, candidate: Candidate, model: ModelFacts) -> float:
        """Host memory the rung's candidate keeps (with ``host_memory``'s words), 0 where the candidate does not carry
        the rung; the memory model sums it over the candidate's rungs."""
        return 0

    def unavailable(self, device: str) -> Optional[str]:
        """Why the rung cannot be probed on ``device`` (it is then left out, with a note); None when it can."""
        return None


class ProbeStep:
    """What a rung does inside the probe's child process; every hook is optional, and a step holds no state between
    probes (each probe is a fresh process, which imports the step by its ``"module:attribute"`` path: a subclass, or
    an instance).

    The probe considers the steps of the built-in rungs (a candidate can carry their fields without the rung's name: a
    user's own config, at the ladder's level 0), then those the ladder's other rungs name
    (``ProbeSettings.rung_steps``), and one step of no rung's (the environment of the user's own DeepSpeed run). Of
    those whose ``active`` says so, it calls ``before_build`` in that order, asks ``keeps_host`` of each as it makes the
    meter (host-aware where one keeps storages in host memory), enters ``around``
    in that order (the first outermost) under the meter, calls ``after_build`` and ``read_back`` in that order; on a
    failure it asks ``failure`` last step first and the first answer is kept (pluggy's firstresult, newest first)."""

    # The names of the rungs that name this step (set by the probe when it loads the step): the default ``active``.
    rungs: FrozenSet[str] = frozenset()
    # How a failure in ``before_build`` is classified: "setup" (the machine's: an infrastructure failure) or "load"
    # (building the trainer's: ``failure`` may claim it for the rung).
    stage: str = "setup"

    def active(self, candidate: Candidate) -> bool:
        """Whether this probe runs the step: by default, when the candidate climbed a rung that names it."""
        return not self.rungs.isdisjoint(candidate.rungs)

    def keeps_host(self, candidate: Candidate) -> bool:
        """Whether the step keeps storages in host memory that the simulated device's meter must tell apart from the
        device's (``set_host``, ``mark_host``: it then logs every allocation and checks the budget after the run)."""
        return False

    def before_build(self, candidate: Candidate) -> None:
        """Before the meter starts and the trainer is built: the environment, an engine's files."""

    def around(self, candidate: Candidate, meter: Any) -> ContextManager[Any]:
        """Entered around building and training, under the meter; what it yields is ``read_back``'s ``handle``."""
        return contextlib.nullcontext()

    def after_build(self, trainer: Any, candidate: Candidate, observed: Dict[str, Any]) -> None:
        """Once the trainer is built, before training: check it took the rung's settings (``FactoryMisuse`` if not).
        ``observed``: what the probe reports of the trainer (``describe_trainer``), to add to."""

    def read_back(self, trainer: Any, candidate: Candidate, meter: Any, handle: Any,
                  observed: Dict[str, Any]) -> Dict[str, Any]:
        """After training, under the meter: figures for the probe's stats (``handle``: what ``around`` yielded)."""
        return {}

    def failure(self, candidate: Candidate, outcome: Outcome, fault: str, cause: str) -> Optional[Tuple[Outcome, str]]:
        """A probe with this step active failed, classified as ``outcome``, ``fault`` and ``cause``
        (``classify_exception``): the rung's own (outcome, cause) when the failure is the rung's (the search then goes
        on without it), None to leave it as it is."""
        return None


def unknown_hooks(obj: Any, contract: type) -> Tuple[str, ...]:
    """The public methods ``obj``'s class defines that are no hook of ``contract`` (``RungBase``, ``ProbeStep``): a
    misspelled hook (``ledgr``, ``read_bak``) would be silently never called."""
    hooks = {name for name in dir(contract) if not name.startswith("_")} | {"apply"}
    own = {name for klass in type(obj).__mro__ if klass not in (contract, object) for name, value in vars(klass).items()
           if callable(value) and not name.startswith("_") and not isinstance(value, type)}
    return tuple(sorted(own - hooks))


def hook_problem(obj: Any, contract: type) -> Optional[str]:
    """What is wrong with ``obj``'s hooks, in words; None when nothing is."""
    unknown = unknown_hooks(obj, contract)
    if not unknown:
        return None
    hooks = sorted({name for name in dir(contract) if not name.startswith("_") and callable(getattr(contract, name))}
                   | {"apply"})
    return (f"{type(obj).__name__} defines {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} no "
            f"hook of {contract.__name__} (its hooks: {', '.join(hooks)})")


def probe_steps(rungs: Iterable[Any]) -> Tuple[Tuple[str, str], ...]:
    """(rung name, probe step path) of each of ``rungs`` that has a probe step, in their order: what the probe's child,
    a fresh process, is told of a ladder's rungs (``ProbeSettings.rung_steps``)."""
    return tuple((rung.name, path) for rung in rungs if (path := getattr(rung, "probe_step", None)))
