"""The cards autofit knows, each declared once: its memory (what ``--gpu-memory CARD`` plans for), its peak dense
bf16/fp16 tensor FLOP rate, its memory bandwidth, its host link and its GPU-to-GPU link. ``parse_size`` takes a card's
name for its memory (``autofit.core._sizes``); the throughput model prices a step on it (``autofit.memory_model``).

Each figure is the vendor's published peak (datasheets and architecture whitepapers) [M: as NVIDIA publishes them;
dense, without sparsity; the SXM part where a card has two]. The host link is the PCIe generation's x16 rate in one
direction; the GPU link is NVLink's total per GPU, or the PCIe rate where the card has none. What a training step
achieves of each is ``autofit.memory_model._throughput``'s coefficients, never folded in here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PCIE3 = 16e9
PCIE4 = 32e9
PCIE5 = 64e9


@dataclass(frozen=True)
class Card:
    name: str
    flops: float  # dense bf16 (fp16 where the card has no bf16) tensor FLOP/s
    bandwidth: float  # device memory, bytes/s
    host_link: float  # bytes/s each way
    gpu_link: float  # bytes/s per GPU to its peers
    source: str
    # Rows per matmul at which it reaches half the large-matmul rate: a GPU's tensor cores idle below a few hundred
    # rows [A: 256]; the CPU meter measures its own (``measured_rates_card``).
    half_rows: float = 256.0
    # Host time per dispatched operator [M: PyTorch's per-operator overhead with a CUDA launch, 5-20 us; 10 assumed]
    op_seconds: float = 10e-6
    # The CPU meter: no Triton (TRL's fused LM head runs its torch fallback) and torch's optimizers loop over the
    # tensors one at a time (foreach is their default on CUDA only [V code: torch.optim.optimizer
    # _default_to_fused_or_foreach])
    cpu: bool = False
    # Seconds per element of a whole-tensor fp32 pass (the CPU meter, measured), which TRL's fused head's torch
    # fallback is made of; 0: its Triton kernel's fused passes at the card's bandwidth
    elementwise_seconds: float = 0.0
    # What torch reports of the card's memory, which --gpu-memory CARD plans for (0: not a card one names: this
    # machine's measured rates)
    memory_mib: int = 0


CARDS = {card.name: card for card in (
    Card("H100", 989e12, 3.35e12, PCIE5, 900e9, "NVIDIA H100 SXM5 datasheet", memory_mib=81559),
    Card("H100-80GB", 989e12, 3.35e12, PCIE5, 900e9, "NVIDIA H100 SXM5 datasheet", memory_mib=81559),
    Card("H200", 989e12, 4.8e12, PCIE5, 900e9, "NVIDIA H200 SXM datasheet", memory_mib=143771),
    Card("A100-80GB", 312e12, 2.039e12, PCIE4, 600e9, "NVIDIA A100 SXM4 80GB datasheet", memory_mib=81920),
    Card("A100-40GB", 312e12, 1.555e12, PCIE4, 600e9, "NVIDIA A100 SXM4 40GB datasheet", memory_mib=40960),
    Card("L40S", 362e12, 864e9, PCIE4, PCIE4, "NVIDIA L40S datasheet", memory_mib=46068),
    Card("L4", 121e12, 300e9, PCIE4, PCIE4, "NVIDIA L4 datasheet", memory_mib=23034),
    Card("A10G", 125e12, 600e9, PCIE4, PCIE4, "NVIDIA A10 datasheet (the A10G is AWS's A10)", memory_mib=23028),
    Card("T4", 65e12, 320e9, PCIE3, PCIE3, "NVIDIA T4 datasheet (fp16: no bf16)", memory_mib=15360),
    Card("V100-32GB", 125e12, 900e9, PCIE3, 300e9, "NVIDIA V100 SXM2 datasheet (fp16: no bf16)", memory_mib=32768),
    Card("RTX4090", 165e12, 1.008e12, PCIE4, PCIE4, "NVIDIA Ada whitepaper (fp16 tensor, fp32 accumulate)",
         memory_mib=24564),
    Card("RTX3090", 71e12, 936e9, PCIE4, PCIE4, "NVIDIA Ampere GA102 whitepaper (fp16 tensor, fp32 accumulate)",
         memory_mib=24576),
)}


def card_named(name: Optional[str]) -> Optional[Card]:
    """The card of a ``--gpu-memory`` name (any case, dashes and spaces ignored); None for a size or another name."""
    if not name:
        return None
    key = name.replace(" ", "").replace("_", "").replace("-", "").upper()
    for card_name, card in CARDS.items():
        if card_name.replace("-", "").upper() == key:
            return card
    return None
