"""Plain-TRL replay of an autofit answer: train the exported configuration with TRL alone and measure its peak.

    python benchmarks/replay.py DIR/best.json --steps 30 --out replay.json

No autofit code runs in this process (it imports neither ``autofit`` nor anything of this repository): what it
trains is read from best.json (``config``, ``model_args``, ``peft``, ``quantization``, ``env``, ``budget_bytes``),
the data are synthetic rows of full length, as autofit's probes use, and on CUDA the same emulated budget is
applied (``torch.cuda.set_per_process_memory_fraction``, the CUDA context counted). The result says whether it ran
out of memory and its peak (reserved + the process's non-PyTorch memory), to compare with autofit's verified peak.
On the CPU there is no budget to apply and no peak to read: the replay trains and reports ``peak_bytes: null``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

TRAINERS = {"sft": ("SFTTrainer", "SFTConfig"), "grpo": ("GRPOTrainer", "GRPOConfig"),
            "rloo": ("RLOOTrainer", "RLOOConfig"), "reward": ("RewardTrainer", "RewardConfig")}


def _rows(vocab: int, length: int, count: int, seed: int = 0):
    rng = random.Random(seed)
    high = min(vocab, 1 << 16) - 4  # the top ids are the synthesized tokenizer's special tokens
    return [[rng.randrange(1, high) for _ in range(length)] for _ in range(count)]


def _cuda_process_bytes(torch) -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory:
                return int(proc.usedGpuMemory)
    except Exception:  # noqa: BLE001 - without NVML's per-process figure, fall back to the device-wide one below
        pass
    free, total = torch.cuda.mem_get_info(0)
    return total - free


def replay(best: dict, steps: int) -> dict:
    for key, value in (best.get("env") or {}).items():
        os.environ[key] = str(value)
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoConfig, BitsAndBytesConfig, PreTrainedTokenizerFast

    algo, config, model_args = best["algo"], dict(best["config"]), best["model_args"]
    path = model_args["model_name_or_path"]
    cuda = not config.get("use_cpu") and torch.cuda.is_available()
    context = 0
    if cuda:
        torch.cuda.init()
        torch.empty(1, device="cuda")
        context = max(0, _cuda_process_bytes(torch) - torch.cuda.memory_reserved(0))
        total = torch.cuda.get_device_properties(0).total_memory
        budget = best.get("budget_bytes")
        if budget and budget < total:
            torch.cuda.set_per_process_memory_fraction((budget - context) / total, 0)
        torch.cuda.reset_peak_memory_stats(0)
    trainer_name, config_name = TRAINERS[algo]
    batch = config["per_device_train_batch_size"] * config["gradient_accumulation_steps"]
    config.update(output_dir=os.environ.get("REPLAY_OUTPUT_DIR", "/tmp/autofit-replay"), max_steps=steps,
                  save_strategy="no", report_to="none", logging_steps=max(steps // 5, 1), disable_tqdm=True)
    length_key = "max_completion_length" if algo in ("grpo", "rloo") else "max_length"
    length = config[length_key]
    vocab = AutoConfig.from_pretrained(path).vocab_size
    if model_args.get("attn_implementation"):  # the attention the probes measured (TRL's --attn_implementation)
        config["model_init_kwargs"] = {**(config.get("model_init_kwargs") or {}),
                                       "attn_implementation": model_args["attn_implementation"]}
    kwargs = {}
    if best.get("peft"):
        from peft import LoraConfig

        peft = best["peft"]
        kwargs["peft_config"] = LoraConfig(r=peft["r"], lora_alpha=peft["lora_alpha"],
                                           lora_dropout=peft["lora_dropout"],
                                           target_modules=peft["target_modules"],
                                           task_type="SEQ_CLS" if algo == "reward" else "CAUSAL_LM")
    quantization = best.get("quantization")
    if quantization:
        if quantization.get("load_in_4bit"):
            compute = torch.bfloat16 if cuda else torch.float32
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                               bnb_4bit_use_double_quant=True,
                                                               bnb_4bit_compute_dtype=compute)
        else:
            kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    padding = {"padding_side": "left"} if algo in ("grpo", "rloo") else {}
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path, **padding)
    rows = batch * steps
    if algo == "sft":
        data = Dataset.from_dict({"input_ids": _rows(vocab, length, rows)})
    elif algo == "reward":
        chosen = _rows(vocab, length, rows)
        data = Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": [list(reversed(r)) for r in chosen]})
    else:  # every completion as long as allowed: the worst case the search measured
        prompt_length = best["search"].get("prompt_length") or 128
        prompts = [" ".join(f"t{i}" for i in row) for row in _rows(vocab, prompt_length, rows)]
        data = Dataset.from_dict({"prompt": prompts})
        config["generation_kwargs"] = {"min_new_tokens": length}
        kwargs["reward_funcs"] = lambda completions, **kw: [float(len(c)) for c in completions]
    trainer = getattr(trl, trainer_name)(model=path, args=getattr(trl, config_name)(**config), train_dataset=data,
                                         processing_class=tokenizer, **kwargs)
    started = time.perf_counter()
    outcome, error = "OK", None
    try:
        trainer.train()
    except torch.OutOfMemoryError as exc:
        outcome, error = "OOM", str(exc).splitlines()[0][:300]
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_reserved(0) + context if cuda else None
    return {"outcome": outcome, "error": error, "steps": trainer.state.global_step, "seconds": round(seconds, 1),
            "peak_bytes": peak, "context_bytes": context if cuda else None, "device": "cuda" if cuda else "cpu",
            "autofit_imported": any(name == "autofit" or name.startswith("autofit.") for name in sys.modules)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("best_json")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True, help="where to write the replay's result (JSON)")
    parser.add_argument("--model-path", help="load the model from this folder instead of best.json's "
                                             "model_name_or_path (offline: the checkpoint the probes loaded)")
    args = parser.parse_args(argv)
    with open(args.best_json) as handle:
        best = json.load(handle)
    if args.model_path:
        best["model_args"]["model_name_or_path"] = args.model_path
    result = replay(best, args.steps)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps(result))
    return 0 if result["outcome"] == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())
