"""Checkpoints whose tensors are never stored: what a probe loads costs neither disk nor host memory in proportion
to the model.

``write`` builds the architecture on the meta device and lets transformers' own ``save_pretrained`` decide what a
checkpoint of it holds (tied weights once, mixture-of-experts weights in their original per-expert layout, shards
and their index). Each shard is then written as a safetensors header followed by a hole: the file has its full
length, but the filesystem stores only the header (a few hundred KB for a 70B model), and reading the hole yields
zeros. TRL loads the folder by path exactly as it loads a real checkpoint, quantization included.

Zero weights would train and generate (memory does not depend on the values), but they are not what a model
looks like: ``fill_on_load`` gives every model loaded from such a folder finite values on its own device, right
after ``from_pretrained``: floating-point weights as ``fill_finite`` does, and the packed codes and scales of
bitsandbytes' 4-bit and 8-bit layers, so that no quantized block is all zero.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
from pathlib import Path
from typing import Dict, Iterator, Optional

from autofit.machine import atomic_write_text

log = logging.getLogger(__name__)

MARKER = ".autofit-virtual"  # beside config.json: the folder's weights are a hole, to be filled on load

# The hub's shard size. Loading maps each shard whole, and a kernel that refuses to map more than the host's memory
# in one piece (the heuristic overcommit default) refuses save_pretrained's 50 GB shards on a 24 GB host.
SHARD_SIZE = "5GB"
FILL_PATTERN_ELEMENTS = 1 << 16
FILL_STD = 0.02  # the usual initializer range of decoder configs
QUANT_SCALE = 2.5 * FILL_STD  # a block's absolute maximum for N(0, 0.02) weights, roughly

_SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


def is_virtual(path) -> bool:
    return path is not None and (Path(str(path)) / MARKER).exists()


def write(hf_config, folder: Path, trust_remote_code: bool = False) -> Dict[str, int]:
    """Write ``hf_config``'s checkpoint into ``folder`` with its tensors as holes. Returns the tensor bytes the
    files stand for and the bytes the filesystem actually allocated for them."""
    import torch
    import transformers.modeling_utils as modeling_utils
    from transformers import AutoModelForCausalLM

    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or torch.float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            hf_config, dtype=dtype, **({"trust_remote_code": True} if trust_remote_code else {}))
    written = {"tensor_bytes": 0, "allocated_bytes": 0}

    def save_as_hole(tensors, filename, metadata=None):
        sizes = write_sparse_safetensors(tensors, filename, metadata)
        for key in written:
            written[key] += sizes[key]

    if not hasattr(modeling_utils, "safe_save_file"):
        raise RuntimeError("this transformers version does not write checkpoints through "
                           "modeling_utils.safe_save_file; autofit cannot write a weightless checkpoint with it")
    original = modeling_utils.safe_save_file
    modeling_utils.safe_save_file = save_as_hole
    try:
        model.save_pretrained(folder, max_shard_size=SHARD_SIZE)
    finally:
        modeling_utils.safe_save_file = original
    atomic_write_text(Path(folder) / MARKER, json.dumps(written) + "\n")
    return written


def write_sparse_safetensors(tensors, filename, metadata: Optional[Dict[str, str]] = None) -> Dict[str, int]:
    """A valid safetensors file for ``tensors`` (only their names, shapes and dtypes are read: meta tensors do)
    whose data region is left as a hole."""
    header: Dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        dtype = str(tensor.dtype).replace("torch.", "")
        if dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name} has dtype {dtype}, which a safetensors file cannot hold")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data region starts 8-byte aligned, as safetensors writes it
    fd = os.open(filename, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)  # no link
    with os.fdopen(fd, "wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        handle.truncate(8 + len(encoded) + offset)
    return {"tensor_bytes": offset, "allocated_bytes": allocated_bytes(filename)}


def allocated_bytes(path) -> int:
    """Bytes the filesystem stores for ``path`` (a hole stores none)."""
    return os.stat(path).st_blocks * 512


@contextlib.contextmanager
def fill_on_load() -> Iterator[None]:
    """While active, every ``from_pretrained`` of a virtual folder returns its model with finite weights."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.__dict__["from_pretrained"]

    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        model = original.__func__(cls, pretrained_model_name_or_path, *args, **kwargs)
        if is_virtual(pretrained_model_name_or_path):
            fill_model(model[0] if isinstance(model, tuple) else model)
        return model

    # Patched for the duration, then restored (mypy refuses assigning to a method).
    PreTrainedModel.from_pretrained = classmethod(from_pretrained)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        PreTrainedModel.from_pretrained = original  # type: ignore[method-assign]


def fill_model(model) -> None:
    fill_finite(model)
    fill_quantized(model)


def fill_finite(model) -> None:
    """Give every floating-point parameter a finite value, fast and on its own device: matrices are tiled with one
    fixed block of N(0, 0.02) draws (a copy, not a draw per element), norm weights are 1 and other vectors 0.
    Buffers the model computed itself (rotary frequencies) are kept; a buffer that is not finite is zeroed."""
    import torch

    blocks = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.is_floating_point() or param.device.type == "meta":
                continue
            if param.ndim <= 1:
                param.fill_(1.0 if "norm" in name.lower() else 0.0)
                continue
            key = (param.dtype, param.device)
            if key not in blocks:
                blocks[key] = _pattern().to(device=param.device, dtype=param.dtype)
            _tile(param.data.view(-1), blocks[key])
        for _, buffer in model.named_buffers():
            if buffer.is_floating_point() and buffer.device.type != "meta" and not bool(torch.isfinite(buffer).all()):
                buffer.zero_()


def fill_quantized(model) -> None:
    """bitsandbytes layers quantized from zeros hold zero codes and zero scales: give them random codes and the
    scale of N(0, 0.02) weights, on their device (4-bit: packed codes and per-block absmax, the absmax itself
    quantized under double quantization; 8-bit: int8 codes and per-row scales)."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if weight is None:
                continue
            kind = type(weight).__name__
            if kind == "Params4bit" and getattr(weight, "quant_state", None) is not None:
                _tile(weight.data.view(-1), _random_bytes(weight.device, weight.dtype))
                state = weight.quant_state
                if getattr(state, "nested", False):
                    state.absmax.fill_(int(torch.argmax(state.state2.code)))  # the code of the largest value
                    state.state2.absmax.fill_(QUANT_SCALE)
                    if torch.is_tensor(state.offset):
                        state.offset.zero_()
                    else:
                        state.offset = 0.0
                else:
                    state.absmax.fill_(QUANT_SCALE)
            elif kind == "Int8Params":
                if weight.dtype == torch.int8:
                    _tile(weight.data.view(-1), _random_bytes(weight.device, torch.int8))
                scales = getattr(weight, "SCB", None)
                if scales is not None:
                    scales.fill_(QUANT_SCALE)  # a row's largest weight: code 127 times scale / 127


def _pattern():
    import torch

    return torch.randn(FILL_PATTERN_ELEMENTS, generator=torch.Generator().manual_seed(0)) * FILL_STD


def _random_bytes(device, dtype):
    import torch

    values = torch.randint(0, 256, (FILL_PATTERN_ELEMENTS,), generator=torch.Generator().manual_seed(0),
                           dtype=torch.int16)
    return (values - 128 if dtype == torch.int8 else values).to(dtype=dtype).to(device)


def _tile(flat, block) -> None:
    size = block.numel()
    whole = flat.numel() // size
    if whole:
        flat[: whole * size].view(whole, size).copy_(block.expand(whole, size))
    rest = flat.numel() - whole * size
    if rest:
        flat[whole * size:].copy_(block[:rest])
