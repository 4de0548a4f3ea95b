"""The throughput model against training speed measured on real GPUs and published for the Hugging Face stack: each
run as its source launched it (``benchmarks/public/fms/``: a TRL config file, and for several GPUs the accelerate
config its source launched with), predicted by nothing but ``autofit estimate ... --json -- <the launch>``, the
user's own door (issue 37, item 4). The figure read is the user's run's ``tokens_per_second_per_gpu``: the
Trainer's ``train_tokens_per_second``, which counts each process's own tokens.

The source: foundation-model-stack/fms-acceleration's reference benchmark (scripts/benchmarks/refs/a100_80gb.csv at
commit 24bdadb, 2025-02-07): fms-hf-tuning's SFT trainer (the Hugging Face Trainer through TRL 0.13's SFTTrainer,
transformers 4.48.1, peft 0.13.2, torch 2.4.1, flash-attn 2.7.3) on A100 80GB GPUs, 100 optimizer steps of packed
4096-token rows, gradient checkpointing, no gradient accumulation; its plain rows (framework "none" and
"baseline-peft-bnb"), not its own kernels. Torchtune's tables are kept aside (issue 37) and are not here.

After them, autofit's own probes on an H100 (``benchmarks/public/h100/``: the configurations its one GPU session
timed), the same way: small models and GRPO, where the time is the operators' launches and the decode, not the
matmuls.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks.page import chosen

REPO = Path(__file__).resolve().parent.parent
FOLDER = "benchmarks/public/fms"
H100_FOLDER = "benchmarks/public/h100"
GOAL = 0.20  # issue 37: published rows within ±20% where the configuration is expressible
MEMORY_GOAL = 0.10  # the memory model's goal against published peaks (make bench-public)
SOURCE = ("[fms-acceleration a100_80gb.csv @ 24bdadb](https://github.com/foundation-model-stack/fms-acceleration/"
          "blob/24bdadb/scripts/benchmarks/refs/a100_80gb.csv)")
MISTRAL = "benchmarks/models/Mistral-7B-v0.1"
MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"  # the Instruct model's architecture, bundled with autofit
LLAMA2_70B = "benchmarks/models/Llama-2-70b-hf"
STACK = ("TRL 0.13's loss over full-vocabulary fp32 logits (TRL 1.16's chunked head is modelled); the run's first "
         "steps and its logging inside the timed 100")
FSDP1 = "FSDP version 1's flat parameters (modelled as FSDP2, said by the estimate)"
ONE_GPU_QLORA = ("the source's plugin warns that on one GPU TRL 0.13's SFTTrainer prepares the 4-bit model with dtype "
                 "casts that slow it down")
MOE = ("the expert loop's launches and host syncs (8 experts a layer; the routing's traffic is counted on transformers "
       "5's loop)")
QUANT_MOE = ("transformers 5 keeps Mixtral's fused experts in bf16 under bitsandbytes (4.48 quantized each expert's "
             "nn.Linear): their dequantization is not in the prediction")


H100_SOURCE = ("autofit's own probes on one H100 80GB, 2026-11-22 (shared/notes/gpu-2026-11-22.md, section 2: trl "
               "1.16, transformers 5.23, torch 2.11), one timing each, not a published benchmark")
H100_STACK = "the probe's own meter and TRL's per-step metrics inside the timed step"


@dataclass(frozen=True)
class Row:
    key: str
    what: str
    config: str  # in ``folder``
    model: Optional[str]  # --model: the configuration folder (the hub is not reachable here); None: the file's
    gpus: int
    batch: Optional[int]  # per_device_train_batch_size as the launch overrides it; None: the file's
    published: float  # train_tokens_per_second, per GPU
    not_expressed: str = ""  # beyond ``STACK``, which no row expresses
    folder: str = FOLDER
    card: str = "A100-80GB"
    trainer: str = "sft"
    peak: Optional[int] = None  # bytes: the source's PyTorch peak (max_memory_allocated, rank 0), where it gives one
    host_cores: Optional[int] = None  # --host-cores: the source's host, where it names one


def _rows(key: str, what: str, config: str, model: str, published: Dict[Tuple[int, int], Tuple[float, int]],
          one_gpu: str = "", many: str = FSDP1) -> List[Row]:
    """A configuration's rows by (GPUs, batch per GPU): (tokens/s per GPU, PyTorch's peak bytes), with what each does
    not express beyond ``STACK``."""
    return [Row(f"{key} {gpus}x{batch}", what, config, model, gpus, batch, tokens, one_gpu if gpus == 1 else many,
                peak=peak) for (gpus, batch), (tokens, peak) in published.items()]


H100_ROWS = (
    Row("h100-sft-0.5b 1x8 ckpt", "Qwen2.5-0.5B SFT, 1024 tokens, fp32 weights under bf16 autocast, checkpointing",
        "sft-0.5b-8x1-ckpt.yaml", None, 1, None, 35666.0, H100_STACK, H100_FOLDER, "H100"),
    Row("h100-sft-0.5b 1x1 (x8)", "Qwen2.5-0.5B SFT, 1024 tokens, micro-batch 1 with 8 accumulated, no checkpointing",
        "sft-0.5b-1x8.yaml", None, 1, None, 8734.0, H100_STACK, H100_FOLDER, "H100"),
    Row("h100-grpo-0.5b 1x8", "Qwen2.5-0.5B GRPO, 8 completions of 512 tokens (transformers' generate)",
        "grpo-0.5b-8x1.yaml", None, 1, None, 378.0, H100_STACK, H100_FOLDER, "H100", "grpo"),
)
ROWS = (
    _rows("mistral-full", "Mistral-7B full fine-tune, pure bf16", "mistral-full.yaml", MISTRAL,
          {(1, 4): (3062.694, 72434837504), (1, 8): (3143.118, 72435230720), (2, 2): (2777.18, 36225939968),
           (2, 4): (3008.934, 36226136576)})
    + _rows("mistral-lora", "Mistral-7B LoRA r16 q/k/v/o, pure bf16", "mistral-lora.yaml", MISTRAL,
            {(1, 4): (3324.155, 26704571904), (1, 8): (3353.809, 38742912512), (2, 2): (2946.306, 15144870400),
             (2, 4): (3168.613, 21959827968)})
    + _rows("mistral-qlora", "Mistral-7B QLoRA (NF4, nested) r16 q/k/v/o, bf16 autocast", "mistral-qlora.yaml",
            MISTRAL, {(1, 4): (2903.78, 20669338112), (1, 8): (2987.456, 37002646016), (2, 2): (2949.205, 9424594432),
                     (2, 4): (3398.665, 15970067968)}, ONE_GPU_QLORA)
    + _rows("mixtral-lora", "Mixtral-8x7B LoRA r16 q/k/v/o, pure bf16", "mixtral-lora.yaml", MIXTRAL,
            {(2, 2): (1571.223, 57554708992), (2, 4): (1834.376, 64851605504)}, many=f"{FSDP1}; {MOE}")
    + _rows("mixtral-qlora", "Mixtral-8x7B QLoRA (NF4, nested) r16 q/k/v/o, bf16 autocast", "mixtral-qlora.yaml",
            MIXTRAL, {(1, 4): (1528.07, 42794268160), (1, 8): (1690.27, 60545920512), (2, 2): (1579.814, 21129981952),
                     (2, 4): (1880.667, 28146350592)},
            f"{ONE_GPU_QLORA}; {MOE}; {QUANT_MOE}", f"{FSDP1}; {MOE}; {QUANT_MOE}")
    + _rows("llama2-70b-qlora", "Llama-2-70B QLoRA (NF4, nested) r16 q/k/v/o, bf16 autocast", "llama70b-qlora.yaml",
            LLAMA2_70B, {(2, 2): (433.53, 46685287936)})
)


def command(row: Row) -> Tuple[str, ...]:
    """What a user types (from the repository's root): their launch after ``--``, as the source ran it."""
    trl: Tuple[str, ...] = ("trl", row.trainer, "--config", f"{row.folder}/{row.config}")
    trl += ("--per_device_train_batch_size", str(row.batch)) if row.batch else ()
    launch = trl if row.gpus == 1 else (
        "accelerate", "launch", "--config_file", f"{row.folder}/accelerate-fsdp.yaml", f"--num_processes={row.gpus}",
        "-m", *trl)
    model = ("--model", row.model) if row.model else ()
    host = ("--host-cores", str(row.host_cores)) if row.host_cores else ()
    return ("autofit", "estimate", "--gpu-memory", row.card, *model, *host, "--json", "--", *launch)


def autofit_cli(*args: str) -> str:
    """What ``autofit ARGS`` prints, run from the repository's root as a user would; the benchmark stops where it
    fails."""
    done = subprocess.run([sys.executable, "-m", "autofit.cli", *args], cwd=REPO, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"autofit {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def predicted(row: Row) -> Tuple[float, Dict[str, float], str, Dict[str, Any]]:
    """The user's run's predicted tokens/s per GPU, its seconds per step by part, its configuration, and the whole
    of ``your_run`` (its memory)."""
    run = json.loads(autofit_cli(*command(row)[1:]))["estimates"][0]["your_run"]
    speed = run["speed"]
    return speed["tokens_per_second_per_gpu"], speed["seconds_by_part"], run["configuration"]["describe"], run


def _largest(parts: Dict[str, float]) -> str:
    total = sum(parts.values())
    top = sorted(parts.items(), key=lambda item: -item[1])[:3]
    return ", ".join(f"{name} {seconds / total:.0%}" for name, seconds in top)


def table() -> str:
    """The published rows, then autofit's own H100 probes, each against what the estimate prints."""
    return "\n".join(_group(chosen(ROWS), SOURCE, "`train_tokens_per_second` (per GPU)", STACK) + [""] + _group(
        chosen(H100_ROWS), H100_SOURCE, "the probe's tok/s", "-"))


def _group(rows: Sequence[Row], source: str, figure: str, stack: str) -> List[str]:
    lines = ["| run | configuration (as its source launched it) | GPUs x batch | command | measured tok/s per GPU | "
             "predicted | error | where the time goes (predicted) | not expressed |",
             "|---|---|---|---|---:|---:|---:|---|---|"]
    errors: List[float] = []
    for row in rows:
        tokens, parts, describe, _ = predicted(row)
        error = tokens / row.published - 1
        errors.append(abs(error))
        mark = "" if abs(error) <= GOAL else " ✗"
        batch = f"{row.gpus} x {row.batch}" if row.batch else f"{row.gpus} x file's"
        lines.append(f"| {row.key} | {row.what} (`{describe}`) | {batch} | `{' '.join(command(row))}` | "
                     f"{row.published:,.0f} | {tokens:,.0f} | {error:+.0%}{mark} | {_largest(parts)} | "
                     f"{row.not_expressed or '-'} |")
    within = sum(error <= GOAL for error in errors)
    lines += ["", f"{within} of {len(errors)} rows within ±{GOAL:.0%} (goal); largest error {max(errors):.0%}, median "
                  f"{sorted(errors)[len(errors) // 2]:.0%}. Source: {source}; measured: {figure}. Not expressed, every "
                  f"row: {stack}. Predicted: the uncalibrated throughput model on the card's published peaks, the "
                  "user's run (`your_run.speed.tokens_per_second_per_gpu`) of what the command prints, nothing else."]
    return lines


def memory_table() -> str:
    """The same runs' memory: the source's PyTorch peak (the Trainer's memory metrics: ``max_memory_allocated`` on
    rank 0) against the estimate's PyTorch figure of the user's run, read from the same command."""
    lines = ["| run | GPUs x batch | command | published PyTorch peak | predicted (its phase) | error | "
             "not expressed |", "|---|---|---|---:|---:|---:|---|"]
    errors: List[float] = []
    for row in chosen([row for row in ROWS if row.peak]):
        assert row.peak is not None
        run = predicted(row)[3]
        allocated = run["pytorch"]["bytes"]
        error = allocated / row.peak - 1
        errors.append(abs(error))
        mark = "" if abs(error) <= MEMORY_GOAL else " ✗"
        lines.append(f"| {row.key} | {row.gpus} x {row.batch} | `{' '.join(command(row))}` | {row.peak / 1e9:.1f} GB | "
                     f"{allocated / 1e9:.1f} GB ({run['phase']}) | {error:+.0%}{mark} | {row.not_expressed or '-'} |")
    within = sum(error <= MEMORY_GOAL for error in errors)
    lines += ["", f"{within} of {len(errors)} rows within ±{MEMORY_GOAL:.0%}; largest error {max(errors):.0%}, median "
                  f"{sorted(errors)[len(errors) // 2]:.0%}. Source: {SOURCE}, `mem_peak_torch_mem_alloc_in_bytes` "
                  "(the Trainer's memory metrics, rank 0). Predicted: the user's run's `pytorch` figure (PyTorch's "
                  f"allocated peak) of what the command prints. Not expressed, every row: {STACK}."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
