"""Building blocks for trainer factories: a loadable model, a synthesized tokenizer, worst-case data.

Random weights by default: peak memory does not depend on weight values. A random-weight checkpoint (weights in
the configuration's dtype, plus a synthesized tokenizer) is written once per configuration to a cache folder, so
TRL loads the model from a path exactly as ``trl sft --model_name_or_path`` would, quantization included.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Dict, List, Optional

from autofit.candidate import Candidate
from autofit.files import cache_dir
from autofit.registry import resolve_model

log = logging.getLogger(__name__)


def special_token_ids(config: Dict) -> Dict[str, int]:
    """pad/eos/bos ids for the synthesized tokenizer: the configuration's own where it has them."""
    vocab = config["vocab_size"]

    def first(value, fallback):
        if isinstance(value, list):
            value = value[0] if value else None
        return value if isinstance(value, int) and 0 <= value < vocab else fallback

    eos = first(config.get("eos_token_id"), vocab - 2)
    bos = first(config.get("bos_token_id"), vocab - 3)
    pad = first(config.get("pad_token_id"), vocab - 1)
    if pad == eos:
        pad = vocab - 1 if eos != vocab - 1 else vocab - 4
    return {"pad": pad, "eos": eos, "bos": bos}


def synthesize_tokenizer(config: Dict):
    """A word-level tokenizer whose vocabulary has exactly the model's size (token ``t{i}`` is id i)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(config["vocab_size"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    ids = special_token_ids(config)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=f"t{ids['pad']}",
        eos_token=f"t{ids['eos']}",
        bos_token=f"t{ids['bos']}",
        unk_token="t0",
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return tokenizer


def _config_hash(config: Dict) -> str:
    return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def model_path(candidate: Candidate) -> str:
    """A path TRL can load: the user's folder with ``--real-weights``, else a cached random-weight checkpoint."""
    source = resolve_model(candidate.model)
    if candidate.real_weights:
        return source.local_path or candidate.model
    code_from = (source.local_path or candidate.model) if candidate.trust_remote_code else None
    return str(random_checkpoint(source.config, candidate.model, code_from=code_from))


def checkpoint_folder(config: Dict, name: str) -> Path:
    return cache_dir() / "random-checkpoints" / f"{name.replace('/', '--')}-{_config_hash(config)}"


def random_checkpoint(config: Dict, name: str, code_from: Optional[str] = None) -> Path:
    """Write (once, under a lock) a checkpoint with random weights and a synthesized tokenizer. ``code_from``: the
    folder (or hub id) of a model that runs its own code (``--trust-remote-code``); its code goes along."""
    folder = checkpoint_folder(config, name)
    if (folder / ".complete").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".complete").exists():
            _write_random_checkpoint(config, folder, code_from)
            (folder / ".complete").touch()
    return folder


def _write_random_checkpoint(config: Dict, folder: Path, code_from: Optional[str] = None) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = dict(config)
    model_type = settings.pop("model_type")
    trust = code_from is not None
    hf_config = AutoConfig.from_pretrained(code_from, trust_remote_code=True) if trust else \
        AutoConfig.for_model(model_type, **settings)
    dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or torch.float32
    log.info("writing a random-weight checkpoint of %s to %s", model_type, folder)
    started = time.perf_counter()
    # Built on the CPU (the device and its meter see only what the trainer itself loads), without the model's
    # weight initialization: its random draws took 350 s for a 7B model on 16 cores, and peak memory does not
    # depend on the values. fill_finite then gives every weight a cheap finite value.
    with no_weight_init():
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, **({"trust_remote_code": True} if trust else {}))
    model.tie_weights()  # skipped with the initialization; the checkpoint must hold tied weights once
    fill_finite(model)
    model.save_pretrained(folder)
    if trust and Path(code_from).is_dir():  # the model's code beside its weights, where from_pretrained looks
        for module in Path(code_from).glob("*.py"):
            shutil.copy(module, folder / module.name)
    synthesize_tokenizer(config).save_pretrained(folder)
    log.info("random-weight checkpoint written in %.1f s", time.perf_counter() - started)


def no_weight_init():
    """transformers' context that skips weight initialization (torch.nn.init and the models' ``init_weights``)."""
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # transformers 4
    return no_init_weights()


FILL_PATTERN_ELEMENTS = 1 << 20
FILL_STD = 0.02  # the usual initializer range of decoder configs


def fill_finite(model) -> None:
    """Give every floating-point parameter a finite value, fast: matrices are tiled with one fixed block of
    N(0, 0.02) draws (a copy, not a draw per element), norm weights are 1 and other vectors 0. The values are
    never all zero in a 4-bit block (an all-zero block quantizes to NaN). Buffers the model computed itself
    (rotary frequencies) are kept; a buffer left uninitialized and not finite is zeroed."""
    import torch

    pattern = torch.randn(FILL_PATTERN_ELEMENTS, generator=torch.Generator().manual_seed(0)) * FILL_STD
    by_dtype = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.is_floating_point():
                continue
            if param.ndim <= 1:
                param.fill_(1.0 if "norm" in name.lower() else 0.0)
                continue
            block = by_dtype.setdefault(param.dtype, pattern.to(param.dtype))
            _tile(param.data.view(-1), block)
        for _, buffer in model.named_buffers():
            if buffer.is_floating_point() and not bool(torch.isfinite(buffer).all()):
                buffer.zero_()


def _tile(flat, block) -> None:
    size = block.numel()
    whole = flat.numel() // size
    if whole:
        flat[: whole * size].view(whole, size).copy_(block.expand(whole, size))
    rest = flat.numel() - whole * size
    if rest:
        flat[whole * size:].copy_(block[:rest])


def load_tokenizer(candidate: Candidate, **kwargs):
    """The tokenizer for ``model_path(candidate)``. A synthesized one is loaded as the generic fast tokenizer:
    AutoTokenizer would pick the architecture's own class (Qwen2Tokenizer, ...) and rebuild it wrongly."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = model_path(candidate)
    loader = AutoTokenizer if candidate.real_weights else PreTrainedTokenizerFast
    return loader.from_pretrained(path, **kwargs)


def synthetic_token_rows(candidate: Candidate, length: int, rows: int) -> List[List[int]]:
    """``rows`` sequences of exactly ``length`` random ordinary token ids (no special tokens), drawn as one tensor
    (seeded: every probe of a search sees the same data)."""
    import torch

    config = resolve_model(candidate.model).config
    vocab = config["vocab_size"]
    special = sorted(set(special_token_ids(config).values()))
    high = min(vocab, 1 << 16)
    ids = torch.randint(0, high, (rows, length), generator=torch.Generator().manual_seed(0))
    ordinary = next(i for i in range(high) if i not in special)
    ids[torch.isin(ids, torch.tensor(special))] = ordinary
    return ids.tolist()


def probe_rows(candidate: Candidate) -> int:
    """As many rows as the probe consumes: its micro-batches of every step."""
    steps = candidate.probe.steps if candidate.probe else 1
    return candidate.micro_batch * candidate.probe_accumulation * steps
