"""best.yaml from a user's config file loads in TRL as it is (issue 36, item 2; issue 35, item 1): a bundled model is
named by its trainable checkpoint (it has no hub id), `--model` over the file's model is the model written, a CPU
search writes what its probes ran with (`use_cpu: true`, `bf16: false`), and the file's list indentation is kept."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from autofit.core import Candidate, LoraSettings, TrlFile
from autofit.export._answer import model_args
from autofit.export._user_yaml import user_yaml
from autofit.launch import probed_as_written

REPO = Path(__file__).resolve().parents[2]

# The README's LoRA file, its modules listed as many users write them (a dash under the key, two spaces in).
LORA = """\
# my LoRA run
model_name_or_path: tiny-qwen2
use_peft: true
lora_r: 8
lora_target_modules:
  - q_proj
  - v_proj
learning_rate: 2.0e-4   # mine
per_device_train_batch_size: 8
max_length: 64
"""


def user_config(path: Path) -> TrlFile:
    """The file as the search holds it, without TRL's parser in a child (tens of seconds on a busy CPU; the slow test
    below reads it the real way)."""
    text = path.read_text()
    keys = YAML(typ="safe").load(text)
    model = {k: v for k, v in keys.items() if k == "model_name_or_path" or k.startswith(("lora_", "use_peft"))}
    training = {k: v for k, v in keys.items() if k not in model}
    return TrlFile(path=str(path), algo="sft", text=text, training=training, model=model, written=keys)


def candidate_of(model: str, micro_batch: int = 4, device: str = "cpu") -> Candidate:
    return Candidate(algo="sft", model=model, device=device, micro_batch=micro_batch, grad_accum=8 // micro_batch,
                     max_length=64, lora=LoraSettings(r=8, alpha=16, target_modules=("q_proj", "v_proj")),
                     rungs=("micro-batch",))


def checkpoint(model: str = "tiny-qwen2") -> str:
    """What --model writes for a bundled model: its trainable checkpoint's folder (the end-to-end test loads it)."""
    name = model_args(candidate_of(model))["model_name_or_path"]
    assert Path(name).is_absolute() and model in name
    return name


def written(path: Path, model: str = "tiny-qwen2", micro_batch: int = 4, device: str = "cpu") -> str:
    """best.yaml's text for the file at ``path`` measured as ``model`` at micro-batch ``micro_batch`` (no probe)."""
    user = user_config(path)
    candidate = candidate_of(model, micro_batch, device)
    exported = {**model_args(candidate), **candidate.training_args()}
    return user_yaml(user, candidate, exported, lambda key: "micro-batch", ["# autofit: header"])[0]


def test_the_files_list_indentation_is_kept(tmp_path):
    path = tmp_path / "lora.yaml"
    for text, block in ((LORA, "lora_target_modules:\n  - q_proj\n  - v_proj\n"),
                        (LORA.replace("  - ", "- "), "lora_target_modules:\n- q_proj\n- v_proj\n"),
                        (LORA.replace("  - ", "    - ") + "env:\n    FOO: bar\n",
                         "lora_target_modules:\n    - q_proj\n    - v_proj\n")):
        path.write_text(text)
        out = written(path, device="cuda")
        assert block in out, out
        assert "learning_rate: 2.0e-4   # mine" in out
        assert "per_device_train_batch_size: 4 # autofit: was 8; micro-batch" in out
    assert "env:\n    FOO: bar" in out  # a nested mapping keeps its own indent too


def test_a_bundled_model_is_named_by_its_trainable_checkpoint_and_a_cpu_search_says_so(tmp_path):
    path = tmp_path / "lora.yaml"
    path.write_text(LORA)
    data = YAML(typ="safe").load(written(path))
    assert data["model_name_or_path"] == checkpoint()  # loadable offline, as --model tiny-qwen2 writes it
    assert data["use_cpu"] is True and data["bf16"] is False  # what the probes ran with; TRL refuses bf16 here
    on_gpu = YAML(typ="safe").load(written(path, device="cuda"))
    assert "use_cpu" not in on_gpu and "bf16" not in on_gpu  # a GPU search keeps the file's own


def test_the_model_measured_is_the_model_written(tmp_path):
    """Issue 35, item 1: a file naming Qwen/Qwen2.5-7B searched with --model tiny-qwen2 wrote the 7B's name with
    tiny-qwen2's batch."""
    path = tmp_path / "big.yaml"
    path.write_text(LORA.replace("tiny-qwen2", "Qwen/Qwen2.5-7B"))
    out = written(path, model="tiny-qwen2")
    line = next(line for line in out.splitlines() if line.startswith("model_name_or_path:"))
    assert line.split()[1] == checkpoint()
    assert "# autofit: was Qwen/Qwen2.5-7B; the model measured (--model tiny-qwen2)" in line
    out = written(path, model="Qwen/Qwen2.5-0.5B", device="cuda")  # a hub id: as --model gave it
    assert "model_name_or_path: Qwen/Qwen2.5-0.5B  # autofit: was Qwen/Qwen2.5-7B" in out
    path.write_text(LORA.replace("tiny-qwen2", "Qwen/Qwen2.5-0.5B"))
    assert "model_name_or_path: Qwen/Qwen2.5-0.5B\n" in written(path, model="Qwen/Qwen2.5-0.5B", device="cuda")


CHAT = [("What is the capital of France?", "Paris is the capital of France."),
        ("Name a primary colour.", "Red is a primary colour.")]


@pytest.mark.slow
def test_a_config_searchs_best_yaml_trains_with_trl(tmp_path):
    """The README's second door end to end: `autofit search --config` on a file that names the bundled model, then
    `trl sft --config best.yaml` on a few rows of text, on this CPU machine, offline."""
    from autofit import cli

    path, out, data = tmp_path / "lora.yaml", tmp_path / "out", tmp_path / "chat"
    path.write_text(LORA)
    assert cli.main(["search", "--config", str(path), "--device", "cpu", "--gpu-memory", "1GiB", "--verify-steps",
                     "3", "--max-probes", "3", "--out", str(out), "-q"]) == 0
    text = (out / "best.yaml").read_text()
    assert "lora_target_modules:\n  - q_proj\n  - v_proj\n" in text and "use_cpu: true" in text
    data.mkdir()
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in CHAT]
    (data / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows * 4))
    trl = Path(sys.executable).parent / "trl"
    done = subprocess.run([str(trl), "sft", "--config", str(out / "best.yaml"), "--dataset_name", str(data),
                           "--output_dir", str(tmp_path / "trained"), "--max_steps", "1", "--report_to", "none",
                           "--save_strategy", "no"], capture_output=True, text=True,
                          env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'train_runtime'" in done.stdout + done.stderr


def test_the_users_attention_and_extra_modules_are_kept_and_named(tmp_path):
    """Issue 39: best.yaml keeps the file's attn_implementation (the probes ran sdpa); keys the probes run as written
    and the ledger leaves out are named in the note, each with its value, and widen the band."""
    from autofit.core import Candidate as C
    from autofit.memory_model import unmodelled

    path = tmp_path / "flash.yaml"
    path.write_text(LORA + "attn_implementation: flash_attention_2\nlora_modules_to_save: [lm_head]\nbf16: false\n")
    out = written(path, device="cuda")
    assert "attn_implementation: flash_attention_2\n" in out and "sdpa" not in out
    user = user_config(path)
    training = {**{k: v for k, v in user.training.items() if k != "attn_implementation"}, "bf16": False}
    user = TrlFile(path=user.path, algo="sft", text=user.text, training=training,
                      model={**user.model, "attn_implementation": "flash_attention_2",
                             "lora_modules_to_save": ["lm_head"]},
                      written=user.written, defaults={"attn_implementation": None, "lora_modules_to_save": None,
                                                      "bf16": None, "learning_rate": 5e-5})
    notes = probed_as_written(user)
    # issue 39 item 2: both reach the probes and the ledger now (tests/search/test_as_written.py): no longer named here
    assert not any("lora_modules_to_save" in note or "attn_implementation" in note for note in notes), notes
    assert any("bf16: False, probed as written" in note for note in notes), notes
    assert not any("learning_rate" in note for note in notes)  # no memory: nothing to say
    candidate = C(algo="sft", model="tiny-qwen2", device="cuda", micro_batch=1, grad_accum=1, max_length=64,
                  user_args=(("bf16", False),))
    assert any("mixed precision" in what for what in unmodelled(candidate))
    assert not unmodelled(candidate.replace(user_args=(("bf16", True),)))


def test_a_key_probed_as_written_is_named_once_with_its_value(tmp_path):
    """A training argument the probes run as written and the ledger leaves out (packing) was named twice in the
    estimate's note: once by the memory model's list of unmodelled arguments, once with its value."""
    path = tmp_path / "sft.yaml"
    path.write_text(LORA + "packing: true\n")
    from autofit.launch import read_launch
    from autofit.launch import unmodelled as unmodelled_by_launch

    # TRL's parser: the defaults the note compares with
    notes = unmodelled_by_launch(read_launch({"config": str(path), "algo": "sft"}))
    packing = [note for note in notes if "packing" in note]
    assert len(packing) == 1 and "packing: True, probed as written" in packing[0], notes
