"""What a probe's checkpoint costs: the weightless checkpoint of each big bundled model, written by a fresh process.

For every model: the tensor bytes the checkpoint stands for, the bytes the filesystem stores, the seconds to write
it (imports excluded) and the peak resident memory of the writing process. A small model is then loaded from its
checkpoint as TRL loads it (``from_pretrained``, weights filled on load) to time that step too.

    .venv/bin/python -m benchmarks.weightless [--write docs/benchmarks.md]   (make bench-weightless; part of make bench)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.page import quick, table_main

MODELS = ["Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-32B", "meta-llama/Llama-3.1-70B",
          "Qwen/Qwen2.5-72B"]
LOADED = "Qwen/Qwen2.5-0.5B"

MEASURE = """
import json, resource, sys, time
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from autofit.probe import _virtual_checkpoint as virtual_checkpoint
from autofit.machine._registry import resolve_model
settings = dict(resolve_model(sys.argv[1]).config)
config = AutoConfig.for_model(settings.pop("model_type"), **settings)
folder = Path(sys.argv[2])
started = time.perf_counter()
written = virtual_checkpoint.write(config, folder)
result = {**written, "write_s": time.perf_counter() - started}
result["files_allocated_bytes"] = sum(virtual_checkpoint.allocated_bytes(p) for p in folder.iterdir())
result["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if sys.argv[3] == "load":
    started = time.perf_counter()
    with virtual_checkpoint.fill_on_load():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    result["load_s"] = time.perf_counter() - started
    result["loaded_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps(result))
"""


def measure(model: str, folder: Path, load: bool) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, model, str(folder), "load" if load else "write"],
                          capture_output=True, text=True, check=True, timeout=1200)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(root: Path) -> str:
    rows = ["| model | tensors GB | on disk | write s | writer peak RSS | load + fill (CPU, bf16) |",
            "|---|---:|---:|---:|---:|---:|"]
    for index, model in enumerate(([] if quick() else MODELS) + [LOADED]):  # quick: write and load the small one
        figures = measure(model, root / str(index), load=model == LOADED)
        load = f"{figures['load_s']:.1f} s" if "load_s" in figures else "-"
        rows.append(f"| {model} | {figures['tensor_bytes'] / 1e9:.1f} | "
                    f"{figures['files_allocated_bytes'] / 2**10:,.0f} KiB | {figures['write_s']:.1f} | "
                    f"{figures['max_rss_bytes'] / 2**20:,.0f} MiB | {load} |")
    return "\n".join(rows)


def main() -> None:
    table_main(__doc__.splitlines()[0], "weightless", table)


if __name__ == "__main__":
    main()
