"""Building blocks for trainer factories: a loadable model, a synthesized tokenizer, worst-case data.

Random weights by default: peak memory does not depend on weight values. A checkpoint of the configuration (its
weights a hole in the file, see ``autofit.probe._virtual_checkpoint``, plus a synthesized tokenizer) is written once per
configuration to a cache folder, so TRL loads the model from a path exactly as ``trl sft --model_name_or_path``
would, quantization included; the probe fills the loaded weights with finite values. Each such entry is checked on
every use (its manifest, written last: what it was built from, each file's size and digest, each safetensors file's
length against its header) and written again, into a new folder that replaces it, when it is not what was written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional

from autofit.core import Candidate, one_line, user_trusts_code
from autofit.machine import cache_entry, cache_subfolder, entry_problem, resolve_model

log = logging.getLogger(__name__)
ENTRY_FORMAT = 2  # how a cache entry is laid out (2: a manifest written last); another value builds every entry again


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


TEXT_SPECIAL_TOKENS = {"pad": "<|pad|>", "eos": "<|endoftext|>", "bos": "<|startoftext|>"}


def text_tokenizer(config: Dict):
    """A byte-level tokenizer built offline, for training a toy model on real text: each of the 256 bytes is a token
    (placed around the configuration's special ids, which keep their places), no merges. The probes' word-level
    tokenizer reads any text as unknown tokens; this one trains on what it is given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = special_token_ids(config)
    free = (i for i in range(config["vocab_size"]) if i not in special.values())
    vocab = {symbol: next(free) for symbol in sorted(pre_tokenizers.ByteLevel.alphabet())}
    vocab.update({TEXT_SPECIAL_TOKENS[role]: index for role, index in special.items()})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=TEXT_SPECIAL_TOKENS["pad"],
                                        eos_token=TEXT_SPECIAL_TOKENS["eos"], bos_token=TEXT_SPECIAL_TOKENS["bos"])
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}" + TEXT_SPECIAL_TOKENS["eos"] + "\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    return tokenizer


def _config_hash(config: Dict) -> str:
    return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def model_path(candidate: Candidate) -> str:
    """A path TRL can load: the user's folder with ``--real-weights``, else a cached weightless checkpoint."""
    source = resolve_model(candidate.model)
    if candidate.real_weights:
        return source.local_path or candidate.model
    # a model without code of its own (no auto_map) has none to trust: built from its configuration, as TRL loads it
    # (a bundled name with trust_remote_code had been looked up on the hub); the user's model_init_kwargs trust it as
    # the flag does (TRL loads the model with them: the folder's code, which the checkpoint must carry)
    trusted = candidate.trust_remote_code or user_trusts_code(candidate.user_args)
    own_code = trusted and bool(source.config.get("auto_map"))
    code_from = (source.local_path or candidate.model) if own_code else None
    return str(random_checkpoint(source.config, candidate.model, code_from=code_from))


def checkpoint_folder(config: Dict, name: str) -> Path:
    """The cache entry of ``name``'s checkpoint (the end of a long local path is enough to tell it apart: the hash
    of the configuration does the rest, and a folder name has at most 255 bytes)."""
    tail = name.replace("/", "--").encode()[-80:].decode(errors="ignore")
    return cache_subfolder("weightless-checkpoints") / f"{tail}-{_config_hash(config)}"


def _entry_key(config: Dict, kind: str) -> str:
    """What a cache entry was built from: the configuration, the kind of checkpoint and the transformers that wrote
    it. Checked on every use (``autofit.machine._files.cache_entry``), with each file's size and digest."""
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        version = "none"
    key = {"config": config, "kind": kind, "transformers": version, "format": ENTRY_FORMAT}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def random_checkpoint(config: Dict, name: str, code_from: Optional[str] = None) -> Path:
    """Write (once, under a lock, into a new folder that then takes its place) a weightless checkpoint and a
    synthesized tokenizer; an entry found damaged is written again. ``code_from``: the folder (or hub id) of a model
    that runs its own code (``--trust-remote-code``); its code goes along."""
    if code_from is None:
        return cache_entry(checkpoint_folder(config, name), _entry_key(config, "weightless"),
                           lambda folder: _write_random_checkpoint(config, folder))
    # with the model's own code beside it, an entry of its own, keyed by that code: a checkpoint built without it (a
    # run that did not trust it) sent TRL to look for the modules on the hub
    return cache_entry(checkpoint_folder(config, name + "-own-code"),
                       _entry_key(config, "weightless-own-code:" + _code_digest(code_from)),
                       lambda folder: _write_random_checkpoint(config, folder, code_from))


def _code_digest(code_from: str) -> str:
    """The digest of a model folder's Python modules (a hub id's code is the hub's: its name stands for it)."""
    folder = Path(code_from)
    if not folder.is_dir():
        return code_from
    digest = hashlib.sha256()
    for module in sorted(folder.glob("*.py")):
        digest.update(module.name.encode() + b"\0" + module.read_bytes())
    return digest.hexdigest()


def _write_random_checkpoint(config: Dict, folder: Path, code_from: Optional[str] = None) -> None:
    from transformers import AutoConfig

    from autofit.probe import _virtual_checkpoint as virtual_checkpoint  # the child's: never loaded by the search

    settings = dict(config)
    model_type = settings.pop("model_type")
    trust = code_from is not None
    hf_config = AutoConfig.from_pretrained(code_from, trust_remote_code=True) if code_from is not None else \
        AutoConfig.for_model(model_type, **settings)
    started = time.perf_counter()
    # The weights are a hole in the file (autofit.probe._virtual_checkpoint): a 70B checkpoint is a few hundred KB on
    # disk and is written in seconds; every probe fills what it loads with finite values on its own device.
    written = virtual_checkpoint.write(hf_config, folder, trust_remote_code=trust)
    # the model's code beside its weights, where from_pretrained looks
    if code_from is not None and Path(code_from).is_dir():
        for module in Path(code_from).glob("*.py"):
            shutil.copy(module, folder / module.name)
    synthesize_tokenizer(config).save_pretrained(folder)
    log.info("weightless checkpoint of %s (%.2f GB of tensors, %.1f MB on disk) written to %s in %.1f s",
             model_type, written["tensor_bytes"] / 1e9, written["allocated_bytes"] / 1e6, folder,
             time.perf_counter() - started)


FILLED = "filled-text"  # the trainable checkpoint's kind: finite weights, the byte-level tokenizer


def trainable_folder(config: Dict, name: str) -> Path:
    """Where ``trainable_checkpoint`` writes ``name``'s checkpoint (best.yaml names it before it is written)."""
    return checkpoint_folder(config, name + "-filled")


def trainable_checkpoint(config: Dict, name: str) -> Path:
    """A checkpoint of a bundled toy model (one without a hub id) with finite values stored, for the user's own
    training run after the search: written once, beside the weightless one the probes load, by a child process
    (the search process never imports torch)."""
    folder = trainable_folder(config, name)
    problem = entry_problem(folder, _entry_key(config, FILLED))
    if problem is not None:
        if os.path.lexists(folder):
            log.warning("the cache entry %s is damaged (%s): building it again", one_line(folder), problem)
        done = subprocess.run([sys.executable, "-c", "import sys; from autofit.probe import kit as probe_kit; "
                               "from autofit.machine import resolve_model; probe_kit.write_trainable_checkpoint("
                               "resolve_model(sys.argv[1]).config, sys.argv[1])", name], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"could not write a random-weight checkpoint of {name} to {folder}: "
                               f"{error_line(done.stderr) or f'exit code {done.returncode}'}")
    return folder


_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(: .*)?")


def error_line(stderr: str) -> str:
    """The exception a child process died of, from its stderr: its last exception line, not whatever was printed
    last (a progress bar drawn after the traceback hid "No space left on device")."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if _EXCEPTION_LINE.fullmatch(line):
            return line
    plain = [line for line in lines if "%|" not in line]  # tqdm's bars
    return plain[-1] if plain else ""


def write_trainable_checkpoint(config: Dict, name: str) -> Path:
    source = random_checkpoint(config, name)

    def build(folder: Path) -> None:
        from transformers import AutoModelForCausalLM

        from autofit.probe import _virtual_checkpoint as virtual_checkpoint

        with virtual_checkpoint.fill_on_load():
            model = AutoModelForCausalLM.from_pretrained(source, dtype="auto")
        model.save_pretrained(folder)
        text_tokenizer(config).save_pretrained(folder)

    return cache_entry(trainable_folder(config, name), _entry_key(config, FILLED), build)


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
    """As many rows as the probe consumes: its micro-batches of every step, on every rank."""
    steps = candidate.probe.steps if candidate.probe else 1
    return candidate.micro_batch * candidate.probe_accumulation * steps * candidate.ranks
