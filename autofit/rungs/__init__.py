"""The ladder and its rungs: each rung a memory optimization with a name, a cost class and
``apply(state) -> state | None``, one private module per optimization (a folder where the rung has code of its own in
the probe's child: ``liger/``, ``activation_offload/``, and ``engines/``, the engines two rungs run), and the default
order from free to costly. ``PLUGIN_API`` is what a rung of another package may import.

Reorder or subset with ``autofit search --ladder NAME,NAME`` or ``autofit.fit(..., ladder=[...])``; a custom rung is
any object that follows ``Rung``. The engines a rung runs under (DeepSpeed ZeRO, FSDP2, accelerate's launch) are
here too, since the rungs that choose them, the probe that launches them and the export that writes them share them.
"""

from autofit.core import Candidate, FactoryMisuse, Outcome, keys_of
from autofit.rungs._allocator import ALLOC_ENV, ExpandableSegments, allocator_options
from autofit.rungs._checkpointing import GradientCheckpointing
from autofit.rungs._contract import ModelFacts, ProbeStep, RungBase, hook_problem, knob, probe_steps
from autofit.rungs._default import (
    DEFAULT_LADDER,
    RUNGS,
    accepted_names,
    carried_rungs,
    is_builtin,
    register,
    replacement_trade,
    resolve_ladder,
    rung_named,
)
from autofit.rungs._failures import FailedRungs
from autofit.rungs._ladder import (
    COSTS,
    FREE,
    FREE_UNDER_ADAPTERS,
    NEVER_DROPPED,
    OFFLOAD_RUNG,
    QUALITY,
    SPEED,
    LadderState,
    Rung,
    climb,
    usable_rungs,
)
from autofit.rungs._lora import Lora
from autofit.rungs._microbatch import MicroBatch
from autofit.rungs._offload import OptimizerOffload
from autofit.rungs._optimizer import EightBitOptimizer
from autofit.rungs._plugins import GROUP as ENTRY_POINT_GROUP
from autofit.rungs._plugins import PluginError, package_of
from autofit.rungs._precision import Bf16Weights
from autofit.rungs._precompute_ref import PrecomputeReference
from autofit.rungs._quantization import QuantizedBase
from autofit.rungs._sequence_length import ShorterSequences
from autofit.rungs._sharding import SHARDING_RUNGS, Sharding
from autofit.rungs.activation_offload import ActivationOffload
from autofit.rungs.engines import (
    ACCELERATE_YAML,
    DEEPSPEED_JSON,
    FSDP_ENGINES,
    ZERO_STAGES,
    deepspeed_config,
    free_port,
    launch_env,
    launch_line,
    process_env,
    rank_env,
    remove_stale_engine_files,
    write_engine_files,
)
from autofit.rungs.liger import LigerKernels
from autofit.rungs.vllm import VllmContext, VllmShare

# What a rung of another package may import (from autofit.rungs, nothing else of autofit): the contract and its
# vocabulary. Its words, ledger, host bytes and probe step are the contract's hooks; what its ledger needs of the
# model is handed in (ModelFacts). tests/rung_plugin is such a package, and a test holds it to this list.
PLUGIN_API = ("Candidate", "FREE", "FactoryMisuse", "LadderState", "ModelFacts", "Outcome", "ProbeStep", "QUALITY",
              "Rung", "RungBase", "SPEED", "keys_of", "knob")

__all__ = [
    "PLUGIN_API", "hook_problem", "Candidate", "FactoryMisuse", "ModelFacts", "Outcome", "keys_of", "knob",
    "ACCELERATE_YAML", "ALLOC_ENV", "allocator_options", "COSTS", "DEEPSPEED_JSON", "DEFAULT_LADDER",
    "ENTRY_POINT_GROUP", "FREE",
    "FREE_UNDER_ADAPTERS", "FSDP_ENGINES", "NEVER_DROPPED", "OFFLOAD_RUNG", "QUALITY", "RUNGS", "SHARDING_RUNGS",
    "SPEED", "ZERO_STAGES", "ActivationOffload", "Bf16Weights", "EightBitOptimizer", "ExpandableSegments",
    "FailedRungs", "GradientCheckpointing", "LadderState", "LigerKernels", "Lora", "MicroBatch", "OptimizerOffload",
    "PrecomputeReference", "PluginError", "package_of", "ProbeStep", "QuantizedBase", "Rung", "RungBase", "Sharding",
    "ShorterSequences", "VllmContext", "VllmShare", "accepted_names", "carried_rungs", "climb", "deepspeed_config",
    "free_port", "is_builtin", "launch_env", "launch_line", "probe_steps", "process_env", "rank_env", "register",
    "remove_stale_engine_files", "replacement_trade", "resolve_ladder", "rung_named", "usable_rungs",
    "write_engine_files",
]
