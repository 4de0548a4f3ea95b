"""The memory model against peaks measured on real GPUs and published for the Hugging Face stack
(``shared/notes/public-measurements.md``): each run as its source launched it, engine included, a TRL config file in
``benchmarks/public/``, estimated by nothing but ``autofit estimate --config FILE --json`` with the flags a user would
type (``make bench-public``; the table between the "public" markers of docs/benchmarks.md). No probe, no GPU, no
change to the candidate and no arithmetic on the ledger in this script: every figure, a phase's included, is read
from what the command prints.

The published figure and what it measures are the source's; where our stack or our ledger cannot express a setting
of the source, the row names it beside its error rather than fitting a coefficient to it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from benchmarks.page import chosen, table_main
from benchmarks.speed_public import memory_table

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
GB = 10**9
GIB = 2**30


@dataclass(frozen=True)
class Published:
    """One published run: its file (``benchmarks/public/``), the flags a user types, and what was measured."""

    key: str
    what: str
    config: str
    flags: Tuple[str, ...]  # after ``autofit estimate --config FILE``
    measured: Optional[Tuple[float, float]]  # bytes: the published figure (a range, or one value twice); None: none
    phase: Optional[str]  # the phase the figure is of, as the estimate's JSON names it (None: the peak)
    reading: str  # what the figure is, in the source's words, and which meter it reads
    not_expressed: str  # the source's settings our stack or ledger does not express
    card: Optional[float] = None  # bytes: a run published only as fitting or not (``measured`` None)
    out_of_memory: bool = False  # the source ran out of memory (at its peak; ``phase``'s figure where one is given)
    meter: str = "nvidia-smi"  # the estimate's figure the published one is compared with: "nvidia-smi" or "pytorch"
    elsewhere: str = ""  # the published outcome is of a GPU the estimate does not size (which, in words): no verdict


LLAMA2_70B = ("--model", "benchmarks/models/Llama-2-70b-hf")
LLAMA3_8B = ("--model", "benchmarks/models/Meta-Llama-3-8B")
ROWS = (
    Published("F1", "Llama-2-70B LoRA r=8 all-linear, FSDP full shard (`fsdp:` + `fsdp_config:`), 8 x H100, "
              "batch 8 x 4, 2048 tokens", "F1.yaml", ("--gpus", "8", "--gpu-memory", "H100", *LLAMA2_70B),
              (72 * GB, 80 * GB), None,
              "72-80 GB per GPU (90-98%), read off a GPU-memory chart: **nvidia-smi**",
              "FSDP version 1 with flat parameters and every LoRA leaf its own unit (modelled as FSDP2, said by the "
              "estimate); the 2024 TRL and transformers loss with full-vocabulary fp32 logits (TRL 1.16 uses its "
              "chunked LM head); the figure spans the whole run, the final save included"),
    Published("F2", "Llama-2-70B QLoRA (NF4, nested, bf16 quant storage), FSDP full shard (`fsdp:` + "
              "`fsdp_config:`), 2 GPUs, batch 2 x 2, 2048 tokens", "F2.yaml",
              ("--gpus", "2", "--gpu-memory", "H100", *LLAMA2_70B), (35.6 * GB, 35.6 * GB), None,
              "35.6 GB per GPU (GPU and tool not stated; read as **nvidia-smi**)",
              "FSDP version 1 over bitsandbytes' 4-bit storage (modelled as FSDP2 over the 4-bit bytes); the 2024 "
              "full-vocabulary fp32 loss; reentrant checkpointing"),
    Published("O1", "Llama-3-8B full SFT, DeepSpeed ZeRO-2 (`deepspeed:`), 1 x A100 80GB, batch 1, 128 tokens, "
              "after the first backward", "O1.yaml", ("--gpu-memory", "A100-80GB", *LLAMA3_8B),
              (61 * GIB, 61 * GIB), "first_backward",
              "61 (GiB) after the backward pass, out of memory at the optimizer step (tool not stated; read as "
              "**nvidia-smi**, in GiB)",
              "OpenRLHF's trainer (not TRL); compared with the estimate's nvidia-smi figure of that phase (its "
              "PyTorch figure beside it)", out_of_memory=True),
    Published("O1-offload", "O1 with its source's fix: `offload_optimizer: {device: cpu}` in its DeepSpeed block",
              "O1-offload.yaml", ("--gpu-memory", "A100-80GB", *LLAMA3_8B), None, None,
              "trains on the A100 80GB (no figure)", "OpenRLHF's trainer (not TRL); DeepSpeed's CPU Adam",
              card=80 * GIB),
)
QWEN_05B = ("--model", "Qwen/Qwen2.5-0.5B")  # bundled; the -Instruct checkpoint has the same configuration
FULL_LOGITS = ("the source's TRL materialized the full-vocabulary logits of chosen and rejected (TRL 1.16's DPO "
               "computes the log-probabilities in chunks without them, the ledger's)")
PREFERENCE_ROWS = (
    Published("D1", "DPO of Qwen2.5-0.5B-Instruct, full, float32 weights with bf16 autocast, its reference a "
              "float32 copy, 1 x A100, batch 4, 512 tokens (TRL PR #5926)", "D1.yaml",
              ("--algo", "dpo", "--gpu-memory", "A100-40GB", *QWEN_05B), (15531 * 2**20, 15531 * 2**20), None,
              "peak 15,531 MB after the PR (18,289 before it), over 3 steps; the meter is not stated (the author's "
              "sibling PR reads `max_memory_allocated`): **PyTorch**, MB read as MiB",
              f"{FULL_LOGITS}; the benchmark's data (its bench.py is not published: full lengths assumed); the "
              "card, written \"A100 44GB\"", meter="pytorch"),
    Published("D2", "DPO of Qwen2.5-0.5B-Instruct, TRL 0.16's quickstart defaults: float32 without autocast, "
              "batch 8, 1,024 tokens, no checkpointing, 1 x A100 80GB (TRL issue #3168)", "D2.yaml",
              ("--algo", "dpo", "--gpu-memory", "A100-80GB", *QWEN_05B), None, None,
              "out of memory at step 0 (no figure)",
              f"{FULL_LOGITS}: at batch 8 x 2 x 1,024 tokens one float32 copy is 10 GB, and TRL 0.16 kept its "
              "log-softmax beside it", card=80 * GIB, out_of_memory=True),
    Published("D2-bf16", "D2 with its fix: the model loaded in bfloat16", "D2-bf16.yaml",
              ("--algo", "dpo", "--gpu-memory", "A100-80GB", *QWEN_05B), None, None,
              "trains (no figure)", FULL_LOGITS, card=80 * GIB),
    Published("D3", "DPO of zephyr-7b-sft-full (Mistral-7B), full, DeepSpeed ZeRO-3 (`deepspeed:`) on 8 GPUs, "
              "batch 8 x 2, 1,024 tokens, its reference sharded too (alignment-handbook's zephyr-7b-beta recipe)",
              "D3.yaml", ("--algo", "dpo", "--gpus", "8", "--gpu-memory", "A100-80GB", "--model",
                          "benchmarks/models/Mistral-7B-v0.1"), None, None,
              "\"You will require 8 GPUs (80GB of VRAM)\" (no figure)",
              "TRL 0.7.7 (full-vocabulary logits) and DeepSpeed 0.12; the card's kind (80 GB, A100 assumed)",
              card=80 * GIB),
)


QWEN_7B = ("--model", "Qwen/Qwen2.5-7B")  # bundled; -Instruct and Qwen2.5-VL-7B's language model have its shape
QWEN_3B = ("--model", "benchmarks/models/Qwen2.5-3B-Instruct")
SWIFT = ("ms-swift's trainer (a subclass of TRL's GRPOTrainer), its defaults where the source does not set a key: "
         "beta 0.04, gradient checkpointing on")
GRPO_ROWS = (
    Published("G5", "GRPO of Qwen2.5-3B-Instruct, full, DeepSpeed ZeRO-3 (`deepspeed:`) on 2 A800s, vLLM served "
              "from a third at 0.5, batch 8 x 8 completions, prompt 256 + completion 4,096 tokens (Datawhale-R1)",
              "G5.yaml", ("--algo", "grpo", "--max-prompt-length", "256", "--gpus", "2", "--gpu-memory", "A100-80GB",
                          "--model", "benchmarks/models/Qwen2.5-3B-Instruct"), None, None,
              "trained 450 steps in 20 hours (no figure)",
              "TRL 0.14's vllm_device (vLLM on a GPU of the node, outside accelerate's processes: server mode here); "
              "the vLLM GPU itself (0.5 of 80 GB for a 3B model) is the server's own --gpu-memory-utilization",
              card=80 * GIB),
    Published("G6", "GRPO of Qwen2.5-7B-Instruct, LoRA r=12 all-linear, ZeRO-3 (`deepspeed:`) on 3 A100 80GB, vLLM "
              "on a fourth at 0.6 (server), batch 8 completions, completion 2,048 tokens (ms-swift issue #3359, "
              "2025-03-03)", "G6.yaml", ("--algo", "grpo", "--gpus", "3", "--gpu-memory", "A100-80GB", *QWEN_7B),
              None, None, "out of memory (screenshots; where is not stated)",
              f"{SWIFT}; the command is cut after the batch (num_generations: swift's 8); the prompts' length "
              "(xpath data, not stated: autofit's 128); which GPU ran out (the trainer's or vLLM's) is not stated",
              card=80 * GIB, out_of_memory=True),
    Published("G7", "GRPO of Qwen2.5-VL-7B-Instruct, LoRA r=8, the vision tower frozen, ZeRO-2 (`deepspeed:`) on 2 "
              "A800 80GB, vLLM colocated at 0.6, batch 2 completions, 4 generations, completion 1,536 tokens, "
              "768 image tokens (ms-swift issue #3426, a maintainer, 2025-03-11)", "G7.yaml",
              ("--algo", "grpo", "--max-prompt-length", "896", "--gpus", "2", "--gpu-memory", "A100-80GB", *QWEN_7B),
              (70 * GIB, 70 * GIB), None,
              "\"approximately 70G per card is required\" (read as **nvidia-smi**, in GiB)",
              f"{SWIFT}; the vision tower (0.67B parameters, 1.3 GB frozen, and its activations: the estimate has "
              "Qwen2.5-7B's language model only); swift's --offload_model/--offload_optimizer (the training model and "
              "optimizer leave the GPU while vLLM generates); the prompt: 768 image tokens (MAX_PIXELS 602112) + 128"),
    Published("G8", "GRPO of Qwen2.5-3B-Instruct, QLoRA r=64 (4-bit nested), 1 training vGPU 32GB and vLLM on a "
              "second at 0.8 (server), batch 8 x 8 completions, completion 4,096 tokens (TRL issue #2864, "
              "2025-02-14: Datawhale-R1 on two GPUs)", "G8.yaml",
              ("--algo", "grpo", "--max-prompt-length", "256", "--gpu-memory", "32GB", *QWEN_3B), None, None,
              "\"the device for vllm always appear OOM when loading weights\" (no figure)",
              "the vLLM server's own GPU: server mode sizes the trainer's GPUs only (no key or flag gives the "
              "server's card and share to the estimate); TRL 0.16's vllm_device; the keys behind the issue's "
              "\"...\" (Datawhale-R1.yaml's, as G5)",
              card=32 * GB, out_of_memory=True, elsewhere="on the vLLM GPU, which server mode does not size"),
    Published("G9", "GRPO of a Qwen2.5-7B fine-tune, LoRA r=8 all-linear, 1 training process on a 24 GB GPU with "
              "ZeRO-3 (`deepspeed:`), vLLM on another at 0.8 (server), batch 2 completions, completion 1,024 "
              "tokens (ms-swift issue #3361, 2025-03-04)", "G9.yaml",
              ("--algo", "grpo", "--max-prompt-length", "1024", "--gpu-memory", "24GiB", *QWEN_7B), None, None,
              "out of memory (\"why is 24g not enough\"; no figure)",
              f"{SWIFT}; num_generations cut from the command (2: the only value TRL 0.15's divisibility check "
              "leaves); the card (24 GB, not named: 24 GiB); the prompt at vLLM's bound, 2,048 - 1,024",
              card=24 * GIB, out_of_memory=True),
    Published("G10", "GRPO of Qwen2.5-3B-Instruct, full, ZeRO-3 (`deepspeed:`) on 6 H20 96GB, `swift rollout` "
              "(vLLM) on two more (server), batch 2 completions, 4 generations, completion 2,048 tokens (ms-swift "
              "issue #4486, 2025-06-05)", "G10.yaml", ("--algo", "grpo", "--gpus", "6", "--gpu-memory", "96GB",
                                                       *QWEN_3B), None, None,
              "\"OOM as soon as training starts\", at batch 2 and with zero3_offload too (no figure)",
              f"{SWIFT}; what ran out is not stated (swift's own best practice trains this model on 2 GPUs); the "
              "prompts' length (Countdown's are short: autofit's 128)", card=96 * GB, out_of_memory=True),
    Published("G11", "GRPO of Qwen2.5-7B-Instruct, full, ZeRO-2 (`deepspeed:`) on 7 GPUs, vLLM on an eighth at 0.7 "
              "(server), batch 1 x 2 completions, 7 generations, completion 2,048 tokens (ms-swift's example "
              "`examples/train/grpo/full_vllm.sh`)", "G11.yaml",
              ("--algo", "grpo", "--gpus", "7", "--gpu-memory", "A100-80GB", *QWEN_7B), None, None,
              "\"GPU memory: 8 * 80GiB\" (runs; no figure)",
              f"{SWIFT}; the prompts' length (NuminaMath-TIR's are short: autofit's 128)", card=80 * GIB),
    Published("G12", "GRPO of Qwen2.5-72B-Instruct, LoRA r=8, ZeRO-3 with parameters and optimizer offloaded "
              "(`deepspeed:`) on 4 x 80 GB, vLLM colocated at 0.55 with tensor parallel 4 and sleep level 1, batch "
              "1 completion, 4 generations, completion 1,024 tokens (ms-swift's example "
              "`examples/train/grpo/internal/vllm_72b_4gpu.sh`)", "G12.yaml",
              ("--algo", "grpo", "--gpus", "4", "--gpu-memory", "A100-80GB", "--model", "Qwen/Qwen2.5-72B"),
              None, None, "\"4*80G GPU\" (runs; no figure)",
              "**vllm_tensor_parallel_size: 4** (probed, not in the ledger: the estimate holds vLLM's whole 72B, "
              "135 GiB, on each GPU, where tensor parallel 4 holds a quarter); vllm_enable_sleep_mode is priced as "
              "TRL's sleep (level 2: nothing in host memory) where swift sleeps at level 1; swift's --offload_model/"
              f"--offload_optimizer and --move_model_batches; {SWIFT}", card=80 * GIB),
)


def command(row: Published) -> Tuple[str, ...]:
    """What a user types (from the repository's root): the estimate as one JSON document (``--json``)."""
    return ("autofit", "estimate", "--config", f"benchmarks/public/{row.config}", *row.flags, "--json")


def read_estimate(printed: str) -> Dict[str, Any]:
    """The user's run as ``autofit estimate --json`` prints it (docs/cli.md's schema): the peak (nvidia-smi and
    PyTorch), its phase, each phase's two figures by its ledger name, the verdict and the host memory it offloads."""
    run = json.loads(printed)["estimates"][0]["your_run"]
    return {
        "peak": run["nvidia_smi"]["bytes"], "allocated": run["pytorch"]["bytes"], "phase": run["phase"],
        "fits": run["fits"], "host": run["host"]["bytes"],
        "phases": {phase["phase"]: (phase["nvidia_smi"]["bytes"], phase["pytorch"]["bytes"], phase["label"])
                   for phase in run["phases"]},
    }


def estimate(row: Published) -> Dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "autofit.cli", *command(row)[1:]], cwd=REPO, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command(row))}: exit {done.returncode}: {done.stderr.strip()}")
    return read_estimate(done.stdout)


def _gb(value: float) -> str:
    return f"{value / GB:.1f} GB"


def table(_: Path) -> str:
    lines = ["| run | configuration (as its source launched it) | command | published (meter) | "
             "predicted: nvidia-smi (PyTorch) | error | not expressed |",
             "|---|---|---|---|---|---|---|"]
    for row in chosen(ROWS + PREFERENCE_ROWS + GRPO_ROWS):
        found = estimate(row)
        phases = found["phases"]
        peak, allocated = float(found["peak"]), float(found["allocated"])
        if row.phase:
            smi, torch, label = phases[row.phase]
            shown = f"{_gb(smi)} ({_gb(torch)}) [{label}]; peak {_gb(peak)} ({_gb(allocated)}) [{found['phase']}]"
            value = smi
        else:
            shown, value = f"{_gb(peak)} ({_gb(allocated)}) [{found['phase']}]", peak
            value = allocated if row.meter == "pytorch" else value
        if row.out_of_memory and row.measured is not None:
            shown += ": out of memory, as published" if not found["fits"] else ": fits, unlike the source"
        if found["host"]:
            shown += f"; host {_gb(float(found['host']))}"
        if row.elsewhere:
            error = (f"{'fits' if found['fits'] else 'does not fit'} on the trainer's GPU; the published outcome is "
                     f"{row.elsewhere}: not comparable")
        elif row.measured is None and row.out_of_memory:
            error = "out of memory, as published" if not found["fits"] else "fits, unlike the source"
        elif row.measured is None:
            error = "fits, as published" if found["fits"] else "does not fit, unlike the source"
        else:
            low, high = row.measured
            middle = (low + high) / 2
            error = f"{(value - middle) / middle:+.1%}" + (" (inside the range)" if low <= value <= high else "")
        lines.append(f"| {row.key} | {row.what} | `{' '.join(command(row))}` | {row.reading} | {shown} | {error} "
                     f"| {row.not_expressed} |")
    lines.append("")
    lines.append("Predicted: what `autofit estimate --config FILE --json` prints for the file as its source launched "
                 "it (engine keys included: `fsdp:`/`fsdp_config:`, `deepspeed:`), uncalibrated, read from its "
                 "`your_run` (the same figures as the text's \"your run\" lines: its peak, and a phase's from \"your "
                 "run at each phase\") by this script and nothing else (`--model` names the model's configuration "
                 "folder: the hub is not reachable here). nvidia-smi = reserved memory plus the CUDA context (and "
                 "NCCL's buffers with several GPUs), the figure the search holds against the budget; PyTorch = "
                 "`max_memory_allocated`. The error is against the published figure (a range's middle), in the "
                 "meter the source reports.")
    lines += ["", "fms-acceleration's A100 80GB benchmark, the same runs as `make bench-speed`'s published rows "
              "(`benchmarks/speed_public.py`: the source, each row's file and launch):", "", memory_table()]
    return "\n".join(lines)


def main() -> None:
    table_main(__doc__.splitlines()[0], "public", table, logging.ERROR)


if __name__ == "__main__":
    main()
