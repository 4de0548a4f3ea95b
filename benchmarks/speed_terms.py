"""Each term of a step's time against a published pair of runs that differ by that term alone (issue 48, item 4):
packing, ``torch_compile``, checkpointing, activation offloading, LoRA and the optimizer's offload, each pair
predicted by nothing but ``autofit estimate ... --json -- trl sft --config FILE`` (``benchmarks/public/terms/``), the
user's door.

The source: torchtune's README, "Optimization flags" (pytorch/torchtune @ 1814feb, 2024-11-18), Llama 3.2 3B on one
A100, batch 2, max_seq_len 4096, pure bf16, each flag added on top of the one before: the one published table found
where every such term is a row of the same run (the sources searched, and those left out with why, are in
docs/benchmarks.md, under the table). Its loop is torchtune's, not the Trainer's: the files carry the same model,
batch, length, precision and optimizer. Its tokens/s counts label tokens that are not padding.

What a pair checks depends on how the estimate prices its term: a term priced from its mechanism (checkpointing,
activation offloading, LoRA, ``torch_compile``'s fused decoder layers since issue 60, 8-bit AdamW) by the ratio of the
two predictions against the measured ratio; ``packing: false``, priced as full rows and called a bound, by whether
the measurement stays under it.

8-bit AdamW has a second pair (issue 60): bitsandbytes' own optimizer benchmark (its benchmarking/README.md), a plain
loop as TRL's is, where torchtune's steps the optimizer inside the backward; it publishes speeds relative to torch's
AdamW, not tokens/s, so its rows hold those ratios.

The optimizer's offload has its own source, the one published pair found with its batch, precision, card and host
stated: torchao's README, "Optimizer CPU offload" (pytorch/ao @ 03cf0ad), a 1.1B ViT on one RTX 4070 Ti SUPER with
and without DeepSpeed's ZeRO-Offload. It trains no language model, so the files price the decoder of its widths, and
the pair is checked by the seconds the offload adds to a step (the host's optimizer step and the link's copies: the
trainable parameters, the card's link and the host set them, not the model's kind), not by the ratio, which the
baseline's own time would carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

from benchmarks.page import chosen
from benchmarks.speed_public import Row, command, predicted

FOLDER = "benchmarks/public/terms"
MODEL = "benchmarks/models/Llama-3.2-3B"
GOAL = 0.20  # a priced term's predicted ratio within ±20% of the measured one, as the published rows' goal
SOURCE = ("[torchtune README @ 1814feb](https://github.com/pytorch/torchtune/blob/"
          "1814feb17a9038e1a8053ce93111bd26774a8db6/README.md), \"Optimization flags\"")
OPTIMIZER_IN_BACKWARD = "the optimizer step fused into the backward (+1.38% in the source)"
TORCHAO = ("[torchao README @ 03cf0ad](https://github.com/pytorch/ao/blob/03cf0adec63fdbae2fd6d2aa7688b52ee8c64004/"
           "torchao/prototype/low_bit_optim/README.md), \"Optimizer CPU offload\"")
VITG_TOKENS = 32 * 257  # a step of the ViT's: 32 images of 257 tokens
VITG = ("a ViT priced as the decoder of its widths (its bidirectional attention, LayerNorm and patch embedding are "
        "not a decoder's, so the baseline's own time is not what the pair checks)")
DESKTOP_HOST = ("the host, a desktop's six cores (Ryzen 5600, DDR4: `--host-cores 6`), priced at this machine's CPU "
                "Adam rate a core and a server's memory bandwidth; \"DeepSpeed is untuned\" (the source)")


def _row(key: str, what: str, config: str, tokens: float, not_expressed: str = "") -> Row:
    return Row(key, what, config, MODEL, 1, None, tokens, not_expressed, FOLDER)


PACKED = _row("packed", "packed rows", "llama32-3b-packed.yaml", 7075.0)
UNPACKED = _row("baseline", "unpacked rows, padded in each batch", "llama32-3b-unpacked.yaml", 2091.0)
COMPILED = _row("+ compile", "packed, compiled", "llama32-3b-packed-compile.yaml", 8998.0)
CHUNKED = _row("+ chunked cross-entropy", "packed, compiled, chunked loss", "llama32-3b-packed-compile.yaml", 9174.0)
CHECKPOINTED = _row("+ activation checkpointing", "packed, compiled, checkpointing", "llama32-3b-compile-ac.yaml",
                    7210.0)
FUSED_STEP = _row("+ optimizer in the backward", "packed, compiled, checkpointing, step in the backward",
                  "llama32-3b-compile-ac.yaml", 7309.0, OPTIMIZER_IN_BACKWARD)
OFFLOADED = _row("+ activation offloading", "packed, compiled, checkpointing, activations offloaded",
                 "llama32-3b-full-ac.yaml", 7301.0, OPTIMIZER_IN_BACKWARD)
LORA = _row("LoRA", "the same with LoRA r64 (all linear layers but k_proj, no dropout), AdamW unfused",
            "llama32-3b-lora-ac.yaml", 8210.0)
EIGHT_BIT = _row("+ 8-bit AdamW", "packed, compiled, checkpointing, activations offloaded, 8-bit AdamW",
                 "llama32-3b-full-ac-8bit.yaml", 6960.0,
                 "the table's \"AdamW8bit\" written as the recipe's own PagedAdamW8bit; "
                 "its optimizer steps inside the backward, where the 8-bit one synchronizes per parameter")
BNB_SOURCE = ("[bitsandbytes benchmarking/README.md @ 1b7b9bb](https://github.com/bitsandbytes-foundation/bitsandbytes/"
              "blob/1b7b9bb4dadc5255f9edb81b4eb95457023d5880/benchmarking/README.md), \"8-bit Optimizers\"")
BNB_LOOP = "its plain loop and the model's own loss over full logits (TRL 1.16's chunked head is modelled)"


def _bnb(key: str, what: str, config: str, speed: float) -> Row:
    """A row of bitsandbytes' optimizer benchmark: its speed relative to torch's AdamW (no tokens/s published)."""
    return Row(key, what, config, "benchmarks/models/Qwen3-0.6B", 1, None, speed, BNB_LOOP, FOLDER)


BNB_ADAMW = _bnb("PyTorch AdamW", "Qwen3-0.6B full fp32, 2 x 128 tokens, torch's AdamW", "bnb-qwen3-adamw.yaml", 1.0)
BNB_8BIT = _bnb("AdamW8bit", "the same with bitsandbytes' AdamW8bit", "bnb-qwen3-adamw8bit.yaml", 0.95)


def _vitg(key: str, what: str, config: str, seconds: float) -> Row:
    """A row of torchao's pair: its seconds a step as tokens/s."""
    return Row(key, what, config, None, 1, None, VITG_TOKENS / seconds, "", FOLDER, card="RTX4070TiSuper",
               host_cores=6)  # a Ryzen 5600


VITG_ON_DEVICE = _vitg("ViT-g AdamW", "fused AdamW on the GPU", "vitg-adamw.yaml", 1.27)
VITG_OFFLOADED = _vitg("ZeRO-Offload", "DeepSpeed ZeRO-2, the optimizer on the host", "vitg-zero-offload.yaml", 3.13)


@dataclass(frozen=True)
class Pair:
    term: str
    before: Row
    after: Row
    check: str  # "ratio": the term is priced; "band": it widens the band; "bound": the prediction is a bound;
    # "seconds": the seconds it adds to a step of ``tokens`` tokens
    not_expressed: str = ""
    tokens: int = 0


PAIRS = (
    Pair("packing", UNPACKED, PACKED, "bound", "the dataset's row lengths (Alpaca's, padded to each batch's longest)"),
    Pair("torch_compile", PACKED, COMPILED, "ratio",
         "the compiled graph's own kernels (inductor's fusion counted on a decoder layer; the band stays wide)"),
    Pair("checkpointing", CHUNKED, CHECKPOINTED, "ratio"),
    Pair("activation offloading", FUSED_STEP, OFFLOADED, "ratio"),
    Pair("LoRA", OFFLOADED, LORA, "ratio",
         "torchtune's adapters stay bf16, where peft (TRL's) upcasts them to fp32 (their casts, scale and add priced "
         "as inductor fuses them: the run compiles)"),
    Pair("optimizer offload", VITG_ON_DEVICE, VITG_OFFLOADED, "seconds", f"{VITG}; {DESKTOP_HOST}", VITG_TOKENS),
    Pair("8-bit AdamW", OFFLOADED, EIGHT_BIT, "ratio"),
    Pair("8-bit AdamW (bitsandbytes' benchmark)", BNB_ADAMW, BNB_8BIT, "ratio"),
)


def _predict(row: Row, cache: Dict[str, Tuple[float, float, bool]]) -> Tuple[float, float, bool]:
    """The user's run's tokens/s per GPU, its speed band, and whether it steps the optimizer on the host; once per
    file."""
    if row.config not in cache:
        speed = predicted(row)[3]["speed"]
        cache[row.config] = (speed["tokens_per_second_per_gpu"], speed["uncertainty"],
                             "optimizer (host)" in speed["seconds_by_part"])
    return cache[row.config]


def _verdict(pair: Pair, before: Tuple[float, float, bool], after: Tuple[float, float, bool]) -> str:
    if pair.check == "bound":
        return "holds: measured under it" if pair.before.published <= before[0] else "✗ measured over the bound"
    if pair.check == "band":
        tokens, band, _ = after
        inside = tokens * (1 - band) <= pair.after.published <= tokens * (1 + band)
        return f"{'inside' if inside else '✗ outside'} the ±{band:.0%} band"
    if pair.check == "seconds":
        if before[2] or not after[2]:  # the estimate read the file's deepspeed: block otherwise than the source ran
            raise SystemExit(f"{pair.after.config}: the estimate does not step the optimizer on the host there alone")
        added = pair.tokens / after[0] - pair.tokens / before[0]
        measured = pair.tokens / pair.after.published - pair.tokens / pair.before.published
        error = added / measured - 1
        mark = "" if abs(error) <= GOAL else " ✗"
        return f"adds {added:.2f} s a step of {measured:.2f} s measured: {error:+.0%}{mark}"
    error = (after[0] / before[0]) / (pair.after.published / pair.before.published) - 1
    return f"ratio {error:+.0%}{'' if abs(error) <= GOAL else ' ✗'}"


def _measured(row: Row) -> str:
    """A row's measurement: its tokens/s, or its speed relative to its pair's baseline where only that is published."""
    return f"{row.published:.2f}x" if row.published < 10 else f"{row.published:,.0f}"


def table() -> str:
    cache: Dict[str, Tuple[float, float, bool]] = {}
    lines = ["| term | before → after (the source's rows) | measured tok/s | measured ratio | predicted tok/s | "
             "predicted ratio | check | not expressed |", "|---|---|---:|---:|---:|---:|---|---|"]
    for pair in chosen(PAIRS):
        before, after = _predict(pair.before, cache), _predict(pair.after, cache)
        measured_ratio = pair.after.published / pair.before.published
        predicted_ratio = after[0] / before[0]
        named = "; ".join(dict.fromkeys(filter(None, (pair.not_expressed, pair.before.not_expressed,
                                                       pair.after.not_expressed))))
        lines.append(
            f"| {pair.term} | {pair.before.key} → {pair.after.key} (`{pair.before.config}` → `{pair.after.config}`) | "
            f"{_measured(pair.before)} → {_measured(pair.after)} | {measured_ratio:.2f} | "
            f"{before[0]:,.0f} → {after[0]:,.0f} | {predicted_ratio:.2f} | "
            f"{_verdict(pair, before, after)} | {named or '-'} |")
    lines += ["", f"Source: {SOURCE}: Llama 3.2 3B, one A100, batch 2, 4,096 tokens, pure bf16, AdamW; measured: "
                  "label tokens that are not padding, per second per GPU. Predicted: the uncalibrated throughput model "
                  "on the A100 80GB's published peaks, `your_run.speed` of what the command prints, e.g. "
                  f"`{' '.join(command(LORA))}`. Not expressed, every torchtune row: its own loop and loss (TRL "
                  "1.16's chunked head is modelled). The optimizer's offload: "
                  f"{TORCHAO}: a 1.1B ViT (timm's ViT-g/14 DINOv2), eager, full bf16, checkpointing, batch 32 on one "
                  "RTX 4070 Ti SUPER; its seconds a step as tokens/s at 257 tokens an image; no published pair of one "
                  "LLM run with and without it, its batch and precision stated, was found (the sources searched are "
                  "named below the table). Predicted there: `your_run.speed` on the RTX 4070 Ti SUPER's published "
                  f"peaks, `{' '.join(command(VITG_OFFLOADED))}`. 8-bit AdamW's second pair: {BNB_SOURCE}, "
                  "Qwen3-0.6B full fp32, batch 2 x 128 tokens on an A100 80GB, speeds relative to torch's AdamW (its "
                  "configuration from the model's published config.json, `benchmarks/models/Qwen3-0.6B`); not "
                  f"expressed: {BNB_LOOP}."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
