"""The ladder's rungs, one module per memory optimization, and the default order (free to costly).

Reorder or subset with ``autofit search --ladder NAME,NAME`` or ``autofit.fit(..., ladder=[...])``; a custom rung
is any object with ``name``, ``cost``, ``help`` and ``apply(state) -> state | None`` (see ``autofit.rungs._ladder``
and ``_contract``); another installed package's rung is named the same way (``_plugins``: entry points).
"""

from typing import Iterable, List, Optional, Tuple

from autofit.core import Candidate
from autofit.rungs import _plugins as plugins
from autofit.rungs._allocator import ExpandableSegments
from autofit.rungs._checkpointing import GradientCheckpointing
from autofit.rungs._contract import RungBase, hook_problem
from autofit.rungs._ladder import Rung, replaces_engine
from autofit.rungs._lora import Lora
from autofit.rungs._microbatch import MicroBatch
from autofit.rungs._offload import OptimizerOffload
from autofit.rungs._optimizer import EightBitOptimizer
from autofit.rungs._precision import Bf16Weights
from autofit.rungs._precompute_ref import PrecomputeReference
from autofit.rungs._quantization import QuantizedBase
from autofit.rungs._sequence_length import ShorterSequences
from autofit.rungs._sharding import OFFLOADING as SHARDING_OFFLOAD
from autofit.rungs._sharding import SHARDING_RUNGS, Sharding
from autofit.rungs.activation_offload import ActivationOffload
from autofit.rungs.liger import LigerKernels
from autofit.rungs.vllm import VllmContext, VllmServer, VllmShare, VllmSleep

DEFAULT_LADDER: Tuple[Rung, ...] = (
    ExpandableSegments(),  # free
    LigerKernels(),  # free; CUDA with liger-kernel installed
    VllmContext(),  # free; GRPO and RLOO with a colocated vLLM
    VllmShare(),  # free; after the context, whose KV cache it sizes
    PrecomputeReference(),  # free; DPO and KTO
    VllmSleep(),  # speed; a colocated vLLM on CUDA: the share released while the trainer trains
    MicroBatch(),  # speed
    *(Sharding(name) for name in SHARDING_RUNGS if name not in SHARDING_OFFLOAD),  # speed; several GPUs only
    GradientCheckpointing(),  # speed
    ActivationOffload(),  # speed; also tried without checkpointing
    OptimizerOffload(),  # speed; taken off again by the quality rungs
    *(Sharding(name) for name in SHARDING_OFFLOAD),  # speed; several GPUs, shards in host memory
    VllmServer(),  # speed; a colocated vLLM on several GPUs: served on some, taken off again by the quality rungs
    Bf16Weights(),  # quality, from here on
    EightBitOptimizer(),
    Lora(),
    QuantizedBase(bits=8),
    QuantizedBase(bits=4),
    ShorterSequences(),
)

RUNGS = {rung.name: rung for rung in DEFAULT_LADDER}
# named: probed on the CPU too
RUNGS[OptimizerOffload.name] = OptimizerOffload(on_simulated_device=True)
RUNGS[ActivationOffload.name] = ActivationOffload(on_simulated_device=True)
RUNGS[LigerKernels.name] = LigerKernels(on_simulated_device=True)


def accepted_names() -> List[str]:
    """Every name ``--ladder`` accepts: the built-in rungs, then those of other installed packages (entry points)."""
    return list(RUNGS) + [name for name in plugins.offered(is_builtin) if name not in RUNGS]


def resolve_ladder(names: Optional[Iterable[str]]) -> List[Rung]:
    """Rungs by name, in the given order; the default ladder when ``names`` is None. A name no rung has, or a rung of
    another package that cannot be used (``plugins.PluginError``: one line naming the package), is a ValueError."""
    if names is None:
        return list(DEFAULT_LADDER)
    rungs = []
    for name in names:
        if name in RUNGS or name in _REGISTERED:
            rungs.append(RUNGS.get(name) or _REGISTERED[name])
            continue
        offered = plugins.offered(is_builtin)
        if name not in offered:
            raise ValueError(f"unknown ladder rung '{name}': accepted are {', '.join(accepted_names())}")
        rungs.append(plugins.load(name, offered[name]))
    return rungs


_REGISTERED: dict = {}  # rungs handed in by name-less doors (fit(ladder=[...]) with objects), by name


def register(rung: Rung) -> None:
    """Make a rung that is not built in known by its name to the stages (its words, its ledger effect). A rung of
    another class under a built-in rung's name is refused (ValueError): the stages would take it for the built-in."""
    builtin = RUNGS.get(rung.name)
    if builtin is not None and type(builtin) is not type(rung):
        raise ValueError(f"your rung {type(rung).__name__} is named '{rung.name}', a built-in rung's name: give it "
                         "another")
    problem = hook_problem(rung, RungBase)
    if problem:
        raise ValueError(f"your rung '{rung.name}': {problem}")
    if builtin is None:
        _REGISTERED[rung.name] = rung


def is_builtin(name: str) -> bool:
    """Whether ``name`` is a built-in rung's, which the stages know through ``Candidate``'s fields."""
    return name in RUNGS


def carried_rungs(candidate: Candidate) -> List[Rung]:
    """The rungs whose effects the candidate may carry: every built-in rung (each reads its own fields, which a
    user's config sets without the rung's name), then the others it names, in its order (a name no rung has any more
    is left out: a stored candidate's)."""
    others = [rung_named(name) for name in candidate.rungs if not is_builtin(name)]
    return list(RUNGS.values()) + [rung for rung in others if rung is not None]


def rung_named(name: str) -> Optional[Rung]:
    """The rung of that name: registered, built in or found through an entry point; None for a name autofit does not
    know (a rung of an earlier version, stored in a study, or of a package that cannot be used: logged once)."""
    found = _REGISTERED.get(name) or RUNGS.get(name)
    if found is not None:
        return found
    offered = plugins.offered(is_builtin)
    return plugins.load_quietly(name, offered[name]) if name in offered else None


def replacement_trade(candidate: Candidate) -> Optional[str]:
    """The trade of the rung whose engine replaced the user's in ``candidate``, in its words; None where it runs the
    user's engine (or none)."""
    if not candidate.replaces:
        return None
    for name in reversed(candidate.rungs):
        rung = rung_named(name)
        if rung is not None and replaces_engine(rung):
            trade = getattr(rung, "trade", None)
            return trade(candidate, {}) if trade is not None else None
    return None
