"""The ladder's rungs, one module per memory optimization, and the default order (free to costly).

Reorder or subset with ``autofit search --ladder NAME,NAME`` or ``autofit.fit(..., ladder=[...])``; a custom rung
is any object with ``name``, ``cost``, ``help`` and ``apply(state) -> state | None`` (see ``autofit.ladder``).
"""

from strategies.allocator import ExpandableSegments
from strategies.checkpointing import GradientCheckpointing
from strategies.lora import Lora
from strategies.microbatch import MicroBatch
from strategies.optimizer import EightBitOptimizer
from strategies.quantization import QuantizedBase
from strategies.sequence_length import ShorterSequences

DEFAULT_LADDER = (
    ExpandableSegments(),  # free
    MicroBatch(),  # speed
    GradientCheckpointing(),  # speed
    EightBitOptimizer(),  # quality, from here on
    Lora(),
    QuantizedBase(bits=8),
    QuantizedBase(bits=4),
    ShorterSequences(),
)

RUNGS = {rung.name: rung for rung in DEFAULT_LADDER}
