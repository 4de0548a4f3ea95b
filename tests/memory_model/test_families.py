"""Every model users bring: parameters counted from the model itself (meta device), what peft and bitsandbytes do to
mixture-of-experts models, and the prior within 5 % of the CPU meter for every family and algorithm it claims.

Tiny configurations are written by ``benchmarks.families``; nothing is downloaded, weights are random."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import spec_of

from autofit.memory_model import (
    CHECKED,
    ModelShape,
    analytic_census,
    ensure_census,
    param_counts,
    predict,
    unchecked_reason,
)
from autofit.memory_model._census import Census, lora_tensors
from autofit.memory_model._census_build import build
from benchmarks.families import ALGOS, FAMILIES, family_candidate, measure, write_family

# Real probes, and claims about how the installed transformers 5 builds each family (fused experts): not for the
# floor lane's transformers 4.
pytestmark = pytest.mark.slow

MIXTRAL_8X7B = "mistralai/Mixtral-8x7B-v0.1"


@pytest.fixture(scope="module")
def family_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("families")


def prepared(family: str, root: Path) -> str:
    """The family's tiny model folder with its census in the cache, built in this process (faster than the child
    process the search starts, which ``test_mixtral_8x7b_is_counted_from_the_model_in_a_child_process`` covers)."""
    from autofit.machine import resolve_model
    from autofit.memory_model._census import census_file, store_census

    model = write_family(family, root)
    config = resolve_model(model).config
    if not census_file(config).is_file():
        store_census(config, build(model))
    return model


def counted(model: str) -> Census:
    """The census built in this process (the search builds it in a child process: ``ensure_census``)."""
    from autofit.machine import resolve_model

    source = resolve_model(model)
    folder = Path(source.local_path) if source.local_path else None
    if folder is None:
        import tempfile

        folder = Path(tempfile.mkdtemp())
        (folder / "config.json").write_text(json.dumps(source.config))
    return Census.from_dict(build(str(folder)))


# -- parameters from the model itself ---------------------------------------------------------------------------------
def test_mixtral_8x7b_is_counted_from_the_model_in_a_child_process():
    census = ensure_census(MIXTRAL_8X7B)
    assert census is not None and census.source == "meta"
    assert census.total == 46_702_792_704
    shape = ModelShape.from_model(MIXTRAL_8X7B)  # reads the cached census
    assert shape.census == census and param_counts(shape).total == 46_702_792_704
    assert (shape.experts, shape.experts_per_token, shape.moe_layers) == (8, 2, 32)
    assert census.experts == 32 * 8 * 3 * 4096 * 14336  # fused gate_up + down: neither quantized nor adapted
    assert census.quantized == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)  # attention only
    assert analytic_census(shape).total == census.total  # the fallback knows mixtral's layout too


def test_mixtral_qlora_keeps_its_experts_in_bf16():
    """transformers 5 fuses the experts into 3-D parameters: bitsandbytes replaces nn.Linear only, so 4-bit leaves
    87 GB of expert weights in bf16; peft's all-linear adapts them through a materialized W + BA (another 87 GB at
    the forward). The estimate must not say QLoRA fits an 80 GB card."""
    from autofit.core import Candidate, LoraSettings

    ensure_census(MIXTRAL_8X7B)
    qlora = Candidate(algo="sft", model=MIXTRAL_8X7B, device="cuda", micro_batch=1, grad_accum=8, max_length=2048,
                      checkpointing=True, lora=LoraSettings(), quantization="4bit", dtype="bfloat16")
    ledger = predict(qlora)
    census = ModelShape.from_model(MIXTRAL_8X7B).census
    assert census.wrapped == 45_097_156_608 + 32 * 8 * 4096  # the experts and the routers
    assert ledger.weights > 2 * 2 * 45_097_156_608
    assert ledger.total > 160 * 2**30


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-7B", "meta-llama/Llama-3.1-8B", "google/gemma-3-1b-it", "tiny-qwen2"])
def test_the_configuration_sizes_agree_with_the_model_for_dense_families(model):
    shape = ModelShape.from_model(model)
    meta, sizes = counted(model), analytic_census(shape)
    assert (sizes.total, sizes.quantized, sizes.embedding, sizes.head) == \
        (meta.total, meta.quantized, meta.embedding, meta.head)
    assert sum(n * c for n, c in lora_tensors(sizes, 16)) == sum(n * c for n, c in lora_tensors(meta, 16))


@pytest.mark.parametrize("family, task", [("mixtral", "CAUSAL_LM"), ("qwen2_moe", "CAUSAL_LM"), ("qwen3", "SEQ_CLS"),
                                          ("gemma2", "CAUSAL_LM")])
def test_lora_and_quantization_rules_match_peft_and_bitsandbytes(family, task, family_root):
    """The census's rules against the libraries themselves, on the model built from the tiny configuration."""
    import bitsandbytes as bnb
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.quantizers.base import get_keys_to_not_convert

    folder = write_family(family, family_root)
    census = Census.from_dict(build(folder)).for_algo("reward" if task == "SEQ_CLS" else "sft")
    config = AutoConfig.from_pretrained(folder, num_labels=1)
    model_class = AutoModelForSequenceClassification if task == "SEQ_CLS" else AutoModelForCausalLM
    with torch.device("meta"):
        model = model_class.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == census.total
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", task_type=task))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert trainable == sum(n * c for n, c in lora_tensors(census, 8))
    with torch.device("meta"):
        fresh = model_class.from_config(config)
    replaced = replace_with_bnb_linear(fresh, modules_to_not_convert=get_keys_to_not_convert(fresh),
                                       quantization_config=BitsAndBytesConfig(load_in_4bit=True))
    assert sum(m.weight.numel() for m in replaced.modules() if isinstance(m, bnb.nn.Linear4bit)) == census.quantized


# -- the prior against the CPU meter ----------------------------------------------------------------------------------
CLAIMS = [(family, algo) for family in FAMILIES for algo in ALGOS if algo in CHECKED.get(family, ())]
# GRPO's extra terms (generation: KV cache, last-position logits, prefill) follow the attention and MLP layouts the
# SFT claims already check family by family; in CI its probes (the slowest: 64 generated tokens each) run for one
# family of each layout, and ``make bench-families`` measures every claim.
GRPO_IN_CI = ("llama", "gemma2", "qwen3", "phi3", "mixtral", "qwen2_moe")
CI_CLAIMS = [(family, algo) for family, algo in CLAIMS if algo != "grpo" or family in GRPO_IN_CI]


@pytest.mark.parametrize("family, algo", CI_CLAIMS)
def test_checked_families_are_predicted_within_5_percent(family, algo, family_root):
    model = prepared(family, family_root)
    measured, predicted, error = measure(model, algo, str(family_root / "out"))
    assert measured is not None, error
    assert predicted / measured == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("family, algo", [("mixtral", "sft"), ("qwen2_moe", "sft"), ("olmoe", "grpo")])
def test_qlora_of_mixture_of_experts_is_predicted_within_5_percent(family, algo, family_root):
    """The experts stay unquantized and peft adapts them through target_parameters: both counted."""
    model = prepared(family, family_root)
    measured, predicted, error = measure(model, algo, str(family_root / "out"), qlora=True)
    assert measured is not None, error
    assert predicted / measured == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("family, algo", [(f, a) for f in FAMILIES for a in ALGOS if (f, a) not in CLAIMS])
def test_unchecked_families_say_so_with_a_wider_band(family, algo, family_root):
    model = prepared(family, family_root)
    shape = ModelShape.from_model(model)
    assert "not checked" in unchecked_reason(shape, algo)
    assert predict(family_candidate(model, algo, str(family_root / "out"))).uncertainty == 0.5


def test_estimate_names_an_unchecked_family(family_root, capsys):
    from autofit.cli import _estimate as estimate
    from autofit.cli import build_parser

    model = prepared("cohere", family_root)  # no reward model in transformers: never checked
    args = build_parser().parse_args(["estimate", "--model", model, "--algo", "reward", "--device", "cpu",
                                      "--gpu-memory", "1GiB", "--max-length", "256"])
    assert estimate.run(args) == 0
    out = capsys.readouterr().out
    assert "parameters counted from the model" in out
    assert "note: the activation terms of cohere are not checked against measurements for reward" in out
    assert "(±50%)" in out


# -- multimodal configurations ----------------------------------------------------------------------------------------
def test_a_model_without_a_causal_lm_class_is_one_line_exit_2(tmp_path, capsys):
    from transformers import AutoConfig

    from autofit import cli

    AutoConfig.for_model("qwen2_5_vl").save_pretrained(tmp_path / "vl")
    for command in (["estimate"], ["search", "--device", "cpu", "--out", str(tmp_path / "out")]):
        code = cli.main(command + ["--model", str(tmp_path / "vl"), "--gpu-memory", "80GiB"])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert code == 2
        assert err.startswith("autofit: error: model ") and "(qwen2_5_vl) has no causal-LM class" in err


def test_a_multimodal_wrapper_is_counted_whole(tmp_path):
    """gemma3's wrapper loads through AutoModelForCausalLM with its vision tower: the sizes are the text model's,
    the parameters the whole model's."""
    from transformers import AutoConfig

    AutoConfig.for_model("gemma3").save_pretrained(tmp_path / "g3")
    census = ensure_census(str(tmp_path / "g3"))
    shape = ModelShape.from_model(str(tmp_path / "g3"))
    assert shape.nested and shape.model_type == "gemma3_text" and census.source == "meta"
    assert census.total == 2_723_312_896 > analytic_census(shape).total
    assert unchecked_reason(shape, "sft") is None


def test_a_damaged_census_in_the_cache_is_built_again(family_root):
    from autofit.machine import resolve_model
    from autofit.memory_model._census import census_file

    model = write_family("qwen3_moe", family_root)
    path = census_file(resolve_model(model).config)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"params": [')  # a census cut short (a full disk, a killed writer)
    census = ensure_census(model)
    assert census is not None and census.source == "meta" and census.experts > 0
    assert Census.from_dict({**json.loads(path.read_text()), "source": "meta"}) == census


def test_the_search_notes_an_unchecked_family_in_its_report(family_root):
    from autofit.rungs import resolve_ladder
    from autofit.search import Search

    try:
        from fakes import FormulaRunner
    except ImportError:  # tests/ became a package
        from tests.fakes import FormulaRunner

    model = prepared("cohere", family_root)
    spec = spec_of(model=model, algo="reward", budget_bytes=2**30, out_dir=family_root / "search", device="cpu",
                      max_length=256)
    search = Search(spec, FormulaRunner(spec.budget_bytes), resolve_ladder(spec.ladder))
    assert any(note.startswith("memory model: the activation terms of cohere are not checked") and "±50%" in note
               for note in search.report.notes)


# -- what could touch CUDA on a GPU machine --------------------------------------------------------------------------
def test_estimate_of_a_moe_model_counts_it_in_a_child_and_never_imports_torch(tmp_path):
    """On a GPU machine a parent that imports torch risks initializing CUDA before the probes fork: the census is
    built in a child (GPU hidden) and the estimating process imports neither torch nor transformers."""
    import os
    import subprocess
    import sys

    try:
        from test_memory_model import ESTIMATE, REPO
    except ImportError:  # tests/ became a package
        from tests.test_memory_model import ESTIMATE, REPO

    env = {**os.environ, "AUTOFIT_CACHE": str(tmp_path / "cache")}  # nothing cached: the child must build it
    done = subprocess.run([sys.executable, "-c", ESTIMATE, "estimate", "--model", MIXTRAL_8X7B,
                           "--gpu-memory", "80GiB"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "46,702,792,704 parameters counted from the model" in done.stdout
    assert list((tmp_path / "cache" / "census").glob("*.json"))


def test_a_users_factory_may_load_a_model_without_a_causal_lm_class(tmp_path):
    from transformers import AutoConfig

    from autofit.search._guide import model_shape

    AutoConfig.for_model("qwen2_5_vl").save_pretrained(tmp_path / "vl")
    spec = spec_of(model=str(tmp_path / "vl"), budget_bytes=2**34, out_dir=tmp_path / "out",
                      factory="my_module:build")
    shape = model_shape(spec)  # no InputError: the factory loads it its own way; the sizes are the text model's
    assert shape is not None and shape.nested and shape.census is None


def test_a_configuration_the_sizes_cannot_read_means_plain_bisection_and_no_census_build(tmp_path):
    """transformers completes a config.json without intermediate_size from its defaults; the memory model's sizes
    cannot, so a user's factory is searched by plain bisection: no exception, and no census built for nothing."""
    from autofit.memory_model._census import census_file
    from autofit.search._guide import model_shape

    config = json.loads(Path(write_family("mixtral", tmp_path)).joinpath("config.json").read_text())
    del config["intermediate_size"]
    folder = tmp_path / "partial"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    assert ensure_census(str(folder)) is None and not census_file(config).exists()
    spec = spec_of(model=str(folder), budget_bytes=2**34, out_dir=tmp_path / "out", factory="my_module:build")
    assert model_shape(spec) is None
