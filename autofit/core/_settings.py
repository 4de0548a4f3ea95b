"""The settings a knob carries as one value: LoRA's adapters, bitsandbytes' 4-bit settings, and the attention kernel
a probe can load on this machine."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional, Tuple, Union

LORA_TARGETS = "all-linear"


@dataclass(frozen=True)
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: Union[str, Tuple[str, ...]] = LORA_TARGETS  # "all-linear", or module names as peft takes them
    # ModelConfig's lora_modules_to_save: modules trained whole beside the adapters (peft's copy of each)
    modules_to_save: Tuple[str, ...] = ()
    use_rslora: bool = False  # ModelConfig's use_rslora: the adapters' scaling alpha/sqrt(r) (no memory of its own)
    # fields added after studies were stored, at their unset values: left out of the candidate's study key then
    LATE: ClassVar[Dict[str, Any]] = {"modules_to_save": [], "use_rslora": False}

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):  # from JSON, or a user's file
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if not isinstance(self.modules_to_save, tuple):
            object.__setattr__(self, "modules_to_save", tuple(self.modules_to_save or ()))


@dataclass(frozen=True)
class QuantSettings:
    """bitsandbytes' 4-bit settings, as ModelConfig names them (``bnb_4bit_quant_type``, ``use_bnb_nested_quant``,
    ``bnb_4bit_quant_storage``). A candidate without them runs the quantization rung's own: nf4 with nested
    quantization, packed in uint8."""

    quant_type: str = "nf4"
    nested: bool = True
    storage: str = "uint8"


# Attention kernels transformers runs on any device; the others need CUDA and, some, a package of their own.
PORTABLE_ATTENTION = ("eager", "sdpa")
ATTENTION_PACKAGES = {"flash_attention_2": ("flash_attn",),
                      "flash_attention_3": ("flash_attn_interface", "flash_attn_3")}
KERNELS_PACKAGE = "kernels"  # a kernels-hub name ("kernels-community/flash-attn") loads through it


def runnable_attention(name: Optional[str], device: str) -> Tuple[Optional[str], Optional[str]]:
    """(the attention the probes load the model with, None: transformers' default, sdpa; why it is not ``name``, the
    user's ModelConfig ``attn_implementation``, or None when the probes run it as written)."""
    if not name or name == "sdpa":
        return None, None
    if name in PORTABLE_ATTENTION:
        return name, None
    if device != "cuda":
        return None, f"{name} needs a CUDA GPU"
    packages = ATTENTION_PACKAGES.get(name, (KERNELS_PACKAGE,) if "/" in name else ())
    if packages and not any(importlib.util.find_spec(package) is not None for package in packages):
        return None, f"{name} needs the {packages[0]} package, which is not installed"
    return name, None
