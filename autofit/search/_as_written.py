"""The keys of a user's TRL file that the probes run as written beside the ones the search maps (issue 39): LoRA's
``lora_modules_to_save`` and ``use_rslora``, the bitsandbytes 4-bit keys, the attention kernel and the file's ``env:``
block, as the ``Baseline`` (``autofit.core``) carries them to the ladder's first level. What a probe here cannot run
as written is said before any probe (``autofit.search._user_config.probe_notes``)."""

from __future__ import annotations

from typing import Any, Dict

# ModelConfig's 4-bit keys (TRL's ``get_quantization_config`` passes them to BitsAndBytesConfig; its compute dtype
# is ModelConfig's ``dtype``, which the candidate carries already).
BNB_KEYS = ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage")
# The environment variables of PyTorch's allocators: the CPU meter counts live tensors, never the allocator's
# segments, so on the CPU they change nothing a probe measures.
ALLOCATOR_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def lora_as_written(model: Dict[str, Any]) -> Dict[str, Any]:
    """LoRA's ModelConfig keys the probes run as written: ``lora_modules_to_save`` (modules trained whole, which the
    ledger counts) and ``use_rslora``."""
    saved = model.get("lora_modules_to_save")
    return {"modules_to_save": tuple(saved) if isinstance(saved, list) else ((saved,) if saved else ()),
            "use_rslora": bool(model.get("use_rslora"))}


def as_written(model: Dict[str, Any], written: Dict[str, Any]) -> Dict[str, Any]:
    """The Baseline's settings the probes run as the file writes them (``model``: ModelConfig's fields as TRL parsed
    them, ``written``: the file's keys): the 4-bit settings (where the file loads in
    4 bits or writes one of their keys: the quantization rung then uses them too), the attention kernel (a probe
    here loads what ``runnable_attention`` says), the ``env:`` block (every probe's environment, as TRL sets it
    before the launch)."""
    from autofit.core import QuantSettings

    settings: Dict[str, Any] = {}
    if model.get("load_in_4bit") or any(key in written for key in BNB_KEYS):
        settings["bnb"] = QuantSettings(quant_type=str(model.get("bnb_4bit_quant_type") or "nf4"),
                                        nested=bool(model.get("use_bnb_nested_quant")),
                                        storage=str(model.get("bnb_4bit_quant_storage") or "uint8"))
    if model.get("attn_implementation") not in (None, "", "sdpa"):  # sdpa: transformers' default, the same study
        settings["attn_implementation"] = str(model["attn_implementation"])
    env = written.get("env")
    if isinstance(env, dict) and env:  # TRL sets each as str(value)
        settings["env"] = tuple(sorted((str(key), str(value)) for key, value in env.items()))
    return settings
