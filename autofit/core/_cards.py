"""The cards autofit knows, each declared once: its memory (what ``--gpu-memory CARD`` plans for, ``parse_size``), its
peak dense bf16/fp16 tensor FLOP rate, memory bandwidth, host link and GPU-to-GPU link, on which the throughput model
prices a step. Each figure is the vendor's published peak [M: datasheets and whitepapers; dense, without sparsity;
bf16 with fp32 accumulate, which GeForce cards run at half their fp16-accumulate rate; the SXM part where a name covers
two]: the host link is PCIe's x16 rate one way, the GPU link NVLink's (or Infinity Fabric's) total per GPU or else
PCIe's, the memory the total the driver reports (nvidia-smi's MiB). What a step achieves of each is the throughput
model's coefficients, never folded in here. On a GPU the card is the one whose ``device_names`` holds NVML's name
(``autofit.machine.card_of_device``), the nearest in memory where a name covers several (the H100's 80 and 94 GB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

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
    # The CPU meter: no Triton (TRL's fused LM head runs its torch fallback), torch's optimizers loop over the tensors
    # one at a time (foreach is their default on CUDA only [V code: torch.optim.optimizer _default_to_fused_or_foreach])
    cpu: bool = False
    # Seconds per element of a whole-tensor fp32 pass (the CPU meter, measured), which TRL's fused head's torch
    # fallback is made of; 0: its Triton kernel's fused passes at the card's bandwidth
    elementwise_seconds: float = 0.0
    # The memory the driver reports (nvidia-smi's MiB), which --gpu-memory CARD plans for (0: not a card one names:
    # this machine's measured rates)
    memory_mib: int = 0
    # The names NVML (nvidia-smi, torch.cuda.get_device_name) reports for the card, and other names a user types
    device_names: Tuple[str, ...] = ()
    aliases: Tuple[str, ...] = ()
    # The host the ranks share (issue 60, item 3): its AdamW in parameters a second per core (torch's, DeepSpeed's
    # CPUAdam), its cores and memory bandwidth, with where they come from; 0: ``memory_model._host_time``'s assumptions
    host_torch_adam: float = 0.0
    host_cpu_adam: float = 0.0
    host_cores: float = 0.0
    host_bandwidth: float = 0.0
    host_source: str = ""


_AMPERE = "NVIDIA Ampere GA102 whitepaper (bf16 tensor, fp32 accumulate)"
_ADA = "NVIDIA Ada Lovelace whitepaper (bf16 tensor, fp32 accumulate)"
_BLACKWELL_RTX = "NVIDIA RTX Blackwell whitepaper (bf16 tensor, fp32 accumulate)"
_GEFORCE = "NVIDIA GeForce "

CARDS = {card.name: card for card in (
    # Data center and workstation
    Card("H100", 989e12, 3.35e12, PCIE5, 900e9, "NVIDIA H100 SXM5 datasheet", memory_mib=81559,
         device_names=("NVIDIA H100 80GB HBM3", "NVIDIA H100"), aliases=("H100-SXM", "H100-80GB")),
    Card("H100-PCIe", 756e12, 2.0e12, PCIE5, PCIE5, "NVIDIA H100 PCIe datasheet", memory_mib=81559,
         device_names=("NVIDIA H100 PCIe",)),
    Card("H100-NVL", 835e12, 3.9e12, PCIE5, 600e9, "NVIDIA H100 NVL datasheet (its NVLink bridge)",
         memory_mib=95830, device_names=("NVIDIA H100 NVL",)),
    Card("H100-94GB", 989e12, 3.9e12, PCIE5, 900e9, "NVIDIA H100 SXM5 94GB (H100 datasheet)", memory_mib=95830,
         device_names=("NVIDIA H100",)),
    Card("H200", 989e12, 4.8e12, PCIE5, 900e9, "NVIDIA H200 SXM datasheet", memory_mib=143771,
         device_names=("NVIDIA H200", "NVIDIA H200 NVL")),
    Card("B200", 2250e12, 8.0e12, PCIE5, 1800e9, "NVIDIA HGX B200 datasheet (1000 W)", memory_mib=183359,
         device_names=("NVIDIA B200",)),
    Card("MI300X", 1307e12, 5.3e12, PCIE5, 896e9, "AMD Instinct MI300X datasheet (Infinity Fabric: 7 x 128 GB/s)",
         memory_mib=196592, device_names=("AMD Instinct MI300X",)),
    Card("A100-80GB", 312e12, 2.039e12, PCIE4, 600e9, "NVIDIA A100 SXM4 80GB datasheet", memory_mib=81920,
         device_names=("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB")),
    Card("A100-80GB-PCIe", 312e12, 1.935e12, PCIE4, PCIE4, "NVIDIA A100 80GB PCIe datasheet", memory_mib=81920,
         device_names=("NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB")),
    Card("A100-40GB", 312e12, 1.555e12, PCIE4, 600e9, "NVIDIA A100 SXM4 40GB datasheet", memory_mib=40960,
         device_names=("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB")),
    Card("A100-40GB-PCIe", 312e12, 1.555e12, PCIE4, PCIE4, "NVIDIA A100 40GB PCIe datasheet", memory_mib=40960,
         device_names=("NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB")),
    Card("L40S", 362e12, 864e9, PCIE4, PCIE4, "NVIDIA L40S datasheet", memory_mib=46068, device_names=("NVIDIA L40S",)),
    Card("L4", 121e12, 300e9, PCIE4, PCIE4, "NVIDIA L4 datasheet", memory_mib=23034, device_names=("NVIDIA L4",)),
    # AWS's A10G: no peak is published; its 80 SMs at a GeForce-like half-rate accumulate (and a measured bf16 matmul
    # of 69.5 TFLOP/s) make about 70, not the A10's 125
    Card("A10G", 70e12, 600e9, PCIE4, PCIE4, "80 SMs of GA102 at 1.71 GHz (AWS publishes no peak; the A10's is 125)",
         memory_mib=23028, device_names=("NVIDIA A10G",)),
    Card("A10", 125e12, 600e9, PCIE4, PCIE4, "NVIDIA A10 datasheet", memory_mib=23028, device_names=("NVIDIA A10",)),
    Card("RTX6000-Ada", 364e12, 960e9, PCIE4, PCIE4, "NVIDIA RTX 6000 Ada datasheet", memory_mib=49140,
         device_names=("NVIDIA RTX 6000 Ada Generation",), aliases=("RTX6000Ada",)),
    Card("A6000", 154.8e12, 768e9, PCIE4, PCIE4, "NVIDIA RTX A6000 datasheet", memory_mib=49140,
         device_names=("NVIDIA RTX A6000",), aliases=("RTX-A6000",)),
    Card("T4", 65e12, 320e9, PCIE3, PCIE3, "NVIDIA T4 datasheet (fp16: no bf16)", memory_mib=15360,
         device_names=("Tesla T4",)),
    Card("V100-32GB", 125e12, 900e9, PCIE3, 300e9, "NVIDIA V100 SXM2 datasheet (fp16: no bf16)", memory_mib=32768,
         device_names=("Tesla V100-SXM2-32GB", "Tesla V100-SXM3-32GB", "Tesla V100-PCIE-32GB",
                       "Tesla V100S-PCIE-32GB")),
    # GeForce
    Card("RTX5090", 209.5e12, 1.792e12, PCIE5, PCIE5, _BLACKWELL_RTX, memory_mib=32607,
         device_names=(_GEFORCE + "RTX 5090", _GEFORCE + "RTX 5090 D")),
    Card("RTX5080", 112.6e12, 960e9, PCIE5, PCIE5, _BLACKWELL_RTX, memory_mib=16303,
         device_names=(_GEFORCE + "RTX 5080",)),
    Card("RTX5070Ti", 87.9e12, 896e9, PCIE5, PCIE5, _BLACKWELL_RTX, memory_mib=16303,
         device_names=(_GEFORCE + "RTX 5070 Ti",)),
    Card("RTX4090", 165e12, 1.008e12, PCIE4, PCIE4, _ADA, memory_mib=24564,
         device_names=(_GEFORCE + "RTX 4090", _GEFORCE + "RTX 4090 D")),
    Card("RTX4080", 97.5e12, 716.8e9, PCIE4, PCIE4, _ADA, memory_mib=16376, device_names=(_GEFORCE + "RTX 4080",)),
    Card("RTX4070TiSuper", 88.2e12, 672e9, PCIE4, PCIE4, _ADA + " (264 tensor cores at 2.61 GHz)", memory_mib=16376,
         device_names=(_GEFORCE + "RTX 4070 Ti SUPER",)),
    Card("RTX4060Ti-16GB", 44.1e12, 288e9, PCIE4 / 2, PCIE4 / 2, _ADA + " (136 tensor cores at 2.535 GHz; PCIe x8)",
         memory_mib=16380, device_names=(_GEFORCE + "RTX 4060 Ti",), aliases=("RTX4060Ti",)),
    Card("RTX3090Ti", 80e12, 1.008e12, PCIE4, PCIE4, _AMPERE, memory_mib=24564,
         device_names=(_GEFORCE + "RTX 3090 Ti",)),
    Card("RTX3090", 71e12, 936e9, PCIE4, PCIE4, _AMPERE, memory_mib=24576, device_names=(_GEFORCE + "RTX 3090",)),
    Card("RTX3080", 59.5e12, 760e9, PCIE4, PCIE4, _AMPERE, memory_mib=10240, device_names=(_GEFORCE + "RTX 3080",)),
    Card("RTX3070", 40.6e12, 448e9, PCIE4, PCIE4, _AMPERE, memory_mib=8192, device_names=(_GEFORCE + "RTX 3070",)),
    Card("RTX3060", 25.5e12, 360e9, PCIE4, PCIE4, _AMPERE + " (112 tensor cores at 1.78 GHz)", memory_mib=12288,
         device_names=(_GEFORCE + "RTX 3060",)),
)}
def card_key(text: str) -> str:
    """A card's name as compared: any case, spaces, dashes and underscores ignored."""
    return re.sub(r"[\s_-]", "", text).upper()


def card_named(name: Optional[str]) -> Optional[Card]:
    """The card of a ``--gpu-memory`` name or alias (any case, dashes and spaces ignored); None for a size or
    another name."""
    if not name:
        return None
    key = card_key(name)
    for card in CARDS.values():
        if key in (card_key(n) for n in (card.name, *card.aliases)):
            return card
    return None
