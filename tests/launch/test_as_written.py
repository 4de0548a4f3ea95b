"""Issue 39, item 2: the keys of a user's TRL file that reach the probes as written and the ledger where they change
memory: ``lora_modules_to_save``, the ``env:`` block, ``attn_implementation``, the bitsandbytes 4-bit keys; and
``model_revision``, kept and named. The slow tests probe tiny-qwen2 with TRL's SFTTrainer on the CPU meter."""

from __future__ import annotations

import dataclasses

import pytest

from autofit import memory_model as mm
from autofit.core import (
    Candidate,
    Launch,
    LoraSettings,
    Outcome,
    TrlFile,
    algorithm,
    blocks,
    runnable_attention,
)
from autofit.core._knob import FileRun
from autofit.core._settings import QuantSettings
from autofit.export._answer import model_args, training_args
from autofit.launch import probe_notes, probed_as_written
from autofit.launch._file_knobs import file_baseline
from autofit.probe import ProcessRunner
from autofit.rungs import LadderState
from autofit.rungs._allocator import ALLOC_ENV, ExpandableSegments

SAVED = ("embed_tokens", "lm_head")
V, H = 8192, 256  # tiny-qwen2's vocabulary and hidden size: each saved module is a V x H weight (untied)


def lora(**changes) -> Candidate:
    return Candidate("sft", "tiny-qwen2", "cpu", micro_batch=2, grad_accum=1, max_length=64,
                     lora=LoraSettings(r=8, **changes))


def user(model: dict, written: dict) -> TrlFile:
    """A file as TRL parsed it (without TRL's parser in a child: tens of seconds on a busy CPU)."""
    return TrlFile(path="sft.yaml", algo="sft", text="", model=model, written=written)


def test_the_files_model_keys_reach_the_candidates_peft_bnb_and_model_settings():
    model = {"use_peft": True, "lora_modules_to_save": list(SAVED), "use_rslora": True, "load_in_4bit": True,
             "bnb_4bit_quant_type": "fp4", "use_bnb_nested_quant": False, "bnb_4bit_quant_storage": "bfloat16",
             "attn_implementation": "eager"}
    file = user(model, {**model, "env": {"AUTOFIT_MARK": 1}})
    settings = dict(file_baseline(file.run))
    assert settings["bnb"] == QuantSettings(quant_type="fp4", nested=False, storage="bfloat16")
    assert settings["env"] == (("AUTOFIT_MARK", "1"),)  # as TRL sets it: str(value)
    assert (settings["lora"].modules_to_save, settings["lora"].use_rslora) == (SAVED, True)
    candidate = lora(modules_to_save=SAVED, use_rslora=True).replace(
        quantization="4bit", bnb=settings["bnb"], attn_implementation=settings["attn_implementation"])
    peft = candidate.peft_config()
    assert set(peft.modules_to_save) == set(SAVED) and peft.use_rslora
    bnb = candidate.quantization_config()
    assert (bnb.bnb_4bit_quant_type, bnb.bnb_4bit_use_double_quant, str(bnb.bnb_4bit_quant_storage)) == \
        ("fp4", False, "torch.bfloat16")
    assert candidate.training_args()["model_init_kwargs"]["attn_implementation"] == "eager"
    # TRL's defaults for a file that only loads in 4 bits: nf4 without nested quantization (not the rung's nested)
    only = {"load_in_4bit": True}
    assert dict(file_baseline(FileRun({}, only, only)))["bnb"] == QuantSettings(nested=False)
    assert "bnb" not in dict(file_baseline(FileRun({}, {}, {})))


def test_best_yaml_writes_the_files_values_not_the_rungs():
    candidate = lora(modules_to_save=SAVED).replace(quantization="4bit", attn_implementation="eager",
                                                    bnb=QuantSettings(quant_type="fp4", nested=False,
                                                                      storage="bfloat16"))
    args = model_args(candidate)
    assert (args["bnb_4bit_quant_type"], args["use_bnb_nested_quant"], args["bnb_4bit_quant_storage"]) == \
        ("fp4", False, "bfloat16")
    assert args["lora_modules_to_save"] == list(SAVED)
    assert "model_init_kwargs" not in training_args(candidate)  # ModelConfig's attn_implementation says it once
    assert blocks(candidate)["quantization"]["bnb_4bit_use_double_quant"] is False  # best.json says the same
    assert blocks(candidate)["peft"]["modules_to_save"] == list(SAVED)
    rung = model_args(lora().replace(quantization="4bit"))  # the quantization rung's own
    assert (rung["bnb_4bit_quant_type"], rung["use_bnb_nested_quant"]) == ("nf4", True)
    assert "bnb_4bit_quant_storage" not in rung and "lora_modules_to_save" not in rung


def test_the_ledger_counts_the_saved_modules_and_the_nested_quantization():
    plain, saved = lora(), lora(modules_to_save=SAVED)
    extra = sum(t.numel * t.count for t in mm.trainable_tensors(mm.ModelShape.from_model("tiny-qwen2"), saved)) - \
        sum(t.numel * t.count for t in mm.trainable_tensors(mm.ModelShape.from_model("tiny-qwen2"), plain))
    assert extra == 2 * V * H
    steps = [ledger for ledger in mm.phase_ledgers(saved) if ledger.phase == "step"][0], \
        [ledger for ledger in mm.phase_ledgers(plain) if ledger.phase == "step"][0]
    # fp32 copies of both modules, and AdamW's two fp32 states of each (the step: after the gradients are freed)
    assert steps[0].weights - steps[1].weights == pytest.approx(2 * V * H * 4)
    assert steps[0].optimizer - steps[1].optimizer == pytest.approx(2 * 2 * V * H * 4)
    nested = mm.predict(plain.replace(quantization="4bit"))
    unnested = mm.predict(plain.replace(quantization="4bit", bnb=QuantSettings(nested=False)))
    storage = mm.predict(plain.replace(quantization="4bit", bnb=QuantSettings(nested=False, storage="bfloat16")))
    assert unnested.weights > nested.weights and storage.weights == unnested.weights
    assert saved.key() != plain.key() and plain.key() == lora().key()


def test_model_revision_is_named_where_it_is_not_main():
    for revision, named in (("v2.0", True), ("main", False)):
        file = TrlFile(path="sft.yaml", algo="sft", text="", model={"model_revision": revision},
                          written={"model_revision": revision}, defaults={"model_revision": "main"})
        notes = probed_as_written(file)
        assert any("model_revision" in note and revision in note for note in notes) is named, notes


def test_attention_is_probed_where_this_machine_runs_it_and_said_where_not():
    assert runnable_attention("eager", "cpu") == ("eager", None)
    assert runnable_attention("sdpa", "cpu") == (None, None)  # the default: the same study as a file without it
    probed, why = runnable_attention("flash_attention_2", "cpu")
    assert probed is None and "CUDA" in why
    assert runnable_attention("kernels-community/flash-attn", "cpu")[0] is None
    shape = mm.ModelShape.from_model("tiny-qwen2")
    assert shape.with_attention("eager").eager_attention and not shape.with_attention("sdpa").eager_attention
    long = lora().replace(max_length=256)
    assert mm.predict(long.replace(attn_implementation="eager")).activations > mm.predict(long).activations
    file = user({"attn_implementation": "flash_attention_2"},
                {"attn_implementation": "flash_attention_2", "env": {ALLOC_ENV: "expandable_segments:True"}})
    notes = probe_notes(Launch(file=file), "cpu")
    assert len(notes) == 2, notes
    assert "flash_attention_2 is not probed here" in notes[0] and "best.yaml keeps flash_attention_2" in notes[0]
    assert ALLOC_ENV in notes[1] and "changes nothing measured here" in notes[1]
    assert probe_notes(Launch(), "cpu") == []


def test_the_allocator_rung_keeps_the_users_other_allocator_options():
    cuda = Candidate("sft", "tiny-qwen2", "cuda", micro_batch=2, grad_accum=1, max_length=64,
                     env=((ALLOC_ENV, "max_split_size_mb:128"), ("OTHER", "1")))
    state = ExpandableSegments().apply(LadderState(cuda))
    assert state is not None
    assert dict(state.candidate.env) == {ALLOC_ENV: "max_split_size_mb:128,expandable_segments:True", "OTHER": "1"}
    already = cuda.replace(env=((ALLOC_ENV, "expandable_segments:True"),))
    assert ExpandableSegments().apply(LadderState(already)) is None  # the user's own: nothing for the rung to do


@pytest.mark.slow
def test_modules_to_save_reach_the_probe_and_the_ledger_predicts_its_peak(tmp_path):
    shape = mm.ModelShape.from_model("tiny-qwen2")
    saved = lora(modules_to_save=SAVED)
    result = ProcessRunner(algorithm("sft").factory, None, tmp_path).run(saved, 2)
    assert result.outcome is Outcome.OK, result.error
    assert result.observed["peft"]["modules_to_save"] == sorted(SAVED)
    adapters = sum(t.numel * t.count for t in mm.trainable_tensors(shape, lora()))
    assert result.observed["trainable_parameters"] == adapters + 2 * V * H  # both modules trained whole
    # the peak rose over plain LoRA's by the copies, their gradients and Adam states (plain LoRA here: 71.6 MiB
    # measured on the CPU meter, 71.8 predicted)
    assert result.peak_bytes > mm.predict(lora()).total + 2 * V * H * 4 * 3
    assert mm.predict(saved).total == pytest.approx(result.peak_bytes, rel=0.05)


@pytest.mark.slow
def test_the_files_4bit_settings_env_and_attention_reach_the_probe(tmp_path):
    runner = ProcessRunner(algorithm("sft").factory, None, tmp_path)
    as_file = lora().replace(quantization="4bit", bnb=QuantSettings(quant_type="fp4", nested=False,
                                                                    storage="bfloat16"),
                             attn_implementation="eager", env=(("AUTOFIT_AS_WRITTEN", "seen"),))
    result = runner.run(as_file, 2)
    assert result.outcome is Outcome.OK, result.error
    assert result.observed["env"] == {"AUTOFIT_AS_WRITTEN": "seen"}  # read back in the probe's own process
    assert result.observed["attn_implementation"] == "eager"
    assert result.observed["quantization"] == {"load_in_4bit": True, "load_in_8bit": False,
                                               "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False,
                                               "bnb_4bit_quant_storage": "bfloat16"}
    assert mm.predict(as_file).total == pytest.approx(result.peak_bytes, rel=0.05)


FILE = """\
model_name_or_path: tiny-qwen2
use_peft: true
lora_r: 8
lora_modules_to_save: [embed_tokens, lm_head]
load_in_4bit: true
bnb_4bit_quant_type: fp4
attn_implementation: flash_attention_2
per_device_train_batch_size: 2
max_length: 64
env:
  PYTORCH_ALLOC_CONF: expandable_segments:True
  AUTOFIT_MARK: 1
"""


def test_a_file_through_the_door_is_the_first_levels_candidate_and_best_yaml_keeps_it(tmp_path):
    """TRL's own parser reads the file; the search's first level runs its settings; best.yaml keeps them unchanged."""
    from fakes import at_door_values

    from autofit.core import SearchOptions
    from autofit.export._user_yaml import user_yaml
    from autofit.launch import read_trl_file
    from autofit.memory_model import base_candidate
    from autofit.search import question

    path = tmp_path / "sft.yaml"
    path.write_text(FILE)
    spec = question(SearchOptions(**at_door_values({"config": str(path), "device": "cpu", "gpu_memory": "1GiB"})))
    first = base_candidate(spec)
    assert first.lora.modules_to_save == SAVED and first.quantization == "4bit"
    assert first.bnb == QuantSettings(quant_type="fp4", nested=False)  # TRL's default: no nested quantization
    assert dict(first.env) == {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "AUTOFIT_MARK": "1"}
    assert first.attn_implementation is None  # flash attention needs CUDA: the probes load sdpa, and say so
    said = [note for note in spec.notes if "flash_attention_2 is not probed here" in note]
    assert len(said) == 1 and "best.yaml keeps flash_attention_2" in said[0]
    assert any("PYTORCH_ALLOC_CONF reaches every probe" in note for note in spec.notes)
    notes = " ".join(spec.notes)
    assert "lora_modules_to_save" not in notes and "bnb_4bit_quant_type" not in notes  # no longer "not probed"
    without_env = tuple((name, value) for name, value in spec.baseline.settings if name != "env")
    assert spec.baseline.key() != dataclasses.replace(spec.baseline, settings=without_env).key()
    user = read_trl_file(str(path), "sft")
    exported = {**model_args(first), **training_args(first)}
    text, changes = user_yaml(user, first, exported, lambda key: "why", ["# header"])
    changed = {change["key"] for change in changes}
    assert not changed & {"lora_modules_to_save", "bnb_4bit_quant_type", "use_bnb_nested_quant", "attn_implementation",
                          "env.PYTORCH_ALLOC_CONF", "env.AUTOFIT_MARK"}, changes
    assert "attn_implementation: flash_attention_2\n" in text and "  AUTOFIT_MARK: 1\n" in text
