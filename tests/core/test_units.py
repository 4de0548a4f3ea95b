"""Small pure pieces: sizes, the spec's validation, the ladder and its rungs, candidates, error classification,
factory references, the offline model registry."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from fakes import spec_of

from autofit.core import (
    Candidate,
    InputError,
    LoraSettings,
    Outcome,
    ProbeResult,
    ProbeSettings,
    SearchOptions,
    SearchSpec,
    format_size,
    parse_size,
)
from autofit.machine import UnknownModelError, resolve_model
from autofit.probe import FactoryError, identity, prepare_factory
from autofit.probe._classify import classify_exception, classify_exit
from autofit.rungs import (
    ALLOC_ENV,
    DEFAULT_LADDER,
    FREE,
    QUALITY,
    RUNGS,
    SPEED,
    ExpandableSegments,
    GradientCheckpointing,
    LadderState,
    Lora,
    MicroBatch,
    QuantizedBase,
    ShorterSequences,
    climb,
    resolve_ladder,
)
from autofit.rungs._optimizer import EIGHT_BIT_ADAMW, EightBitOptimizer

DEFAULT_NAMES = [
    "expandable-segments", "liger-kernels", "vllm-context", "vllm-share", "precompute-ref", "vllm-sleep", "micro-batch",
    "zero1",
    "zero2", "fsdp2", "zero3", "checkpointing",
    "activation-offload", "optimizer-offload", "fsdp2-offload", "zero3-offload", "vllm-server", "bf16-weights",
    "optimizer-8bit", "lora", "quant-8bit", "quant-4bit", "shorter-length",
]


def candidate(**changes) -> Candidate:
    fields = dict(algo="sft", model="tiny-qwen2", device="cuda", micro_batch=8, grad_accum=1, max_length=512)
    fields.update(changes)
    return Candidate(**fields)


def state(min_length=128, maximize="batch", **changes) -> LadderState:
    return LadderState(candidate(**changes), min_length=min_length, maximize=maximize)


# -- sizes ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("24GiB", 24 * 2**30),
    ("80GB", 80 * 10**9),
    ("512MiB", 512 * 2**20),
    ("1.5g", int(1.5 * 2**30)),
    (" 2 gib ", 2 * 2**30),
    ("300MiB", 300 * 2**20),
    ("1024", 1024),
])
def test_parse_size_good(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["12XB", "-1GiB", "abc", "", "0GiB", "GiB", "1.2.3GB"])
def test_parse_size_bad_names_the_value(text):
    with pytest.raises(InputError) as err:
        parse_size(text)
    assert f"'{text}'" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("nbytes, text", [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (2**20, "1.00 MiB"),
    (int(1.5 * 2**30), "1.50 GiB"), (80 * 2**30, "80.00 GiB"),
])
def test_format_size(nbytes, text):
    assert format_size(nbytes) == text


@pytest.mark.parametrize("name, mib", [("H100", 81559), ("h100-80gb", 81559), ("A100-80GB", 81920),
                                       ("a100_40gb", 40960), ("L4", 23034), ("RTX 4090", 24564)])
def test_a_gpu_by_its_name_is_its_whole_memory(name, mib):
    # "80GB" is 10**9 bytes, 74.51 GiB: a card's name gives what the driver reports for it
    assert parse_size(name) == mib * 2**20
    assert parse_size("80GB") == 80 * 10**9 < parse_size("A100-80GB")


def test_a_name_of_cards_of_different_sizes_is_refused_with_the_choices():
    with pytest.raises(InputError, match="A100-40GB, A100-80GB"):
        parse_size("A100")
    with pytest.raises(InputError, match="--gpu-memory 'A100' is not valid: accepted are A100-40GB, A100-80GB"):
        SearchOptions(model="tiny-qwen2", gpu_memory="A100")


def test_format_size_round_trips_through_parse_size():
    for n in (2**20, 3 * 2**30, 512 * 2**20):
        assert parse_size(format_size(n).replace(" ", "")) == n


# -- the spec ---------------------------------------------------------------------------------------------------
def spec(**kw) -> SearchSpec:
    fields = dict(model="tiny-qwen2", device="cpu", budget_bytes=2**30)
    fields.update(kw)
    return spec_of(**fields)


@pytest.mark.parametrize("kw, named", [
    (dict(algo="dpo-nope"), "dpo-nope"),
    (dict(min_length=600, max_length=512), "600"),
    (dict(maximize="speed"), "speed"),
    (dict(device="gpu"), "gpu"),
    (dict(effective_batch=0), "0"),
    (dict(max_length=-5), "-5"),
    (dict(probe_steps=1), "1"),
    (dict(min_length=0), "0"),
])
def test_spec_validation_errors_name_the_value(kw, named):
    # a CPU search without --gpu-memory is refused by question(), after the host's memory is weighed (issue 61):
    # tests/cli/test_no_gpu.py
    with pytest.raises(InputError) as err:
        spec(**kw)
    message = str(err.value)
    assert named in message and "\n" not in message


def test_spec_min_length_above_max_names_both():
    with pytest.raises(InputError, match="--min-length 600 is above --max-length 512"):
        spec(min_length=600, max_length=512)


def test_spec_defaults():
    assert spec(max_length=512).min_length == 512  # batch: never cut by default
    assert spec(max_length=512, maximize="length").min_length == 128
    assert spec(max_length=64, maximize="length").min_length == 64
    assert spec(ladder=["lora", "micro-batch"]).ladder == ("lora", "micro-batch")


def test_study_name_changes_with_the_question():
    base = spec()
    assert base.study_name() == spec().study_name()
    for change in (dict(budget_bytes=2**31), dict(max_length=256), dict(effective_batch=4), dict(ladder=["lora"]),
                   dict(maximize="length"), dict(user_args={"learning_rate": 1e-4})):
        assert spec(**change).study_name() != base.study_name(), change


# -- the ladder -------------------------------------------------------------------------------------------------
def test_resolve_ladder_default_and_order():
    assert [r.name for r in resolve_ladder(None)] == DEFAULT_NAMES
    assert list(RUNGS) == DEFAULT_NAMES
    assert [r.name for r in resolve_ladder(["lora", "micro-batch"])] == ["lora", "micro-batch"]
    assert [r.cost for r in DEFAULT_LADDER] == [FREE] * 5 + [SPEED] * 12 + [QUALITY] * 6


def test_resolve_ladder_unknown_name():
    with pytest.raises(ValueError) as err:
        resolve_ladder(["micro-batch", "warp-drive"])
    assert "'warp-drive'" in str(err.value) and "micro-batch" in str(err.value)


def test_climb_is_cumulative_and_cost_never_decreases():
    levels = climb(state(), resolve_ladder(["lora", "checkpointing", "micro-batch"]))
    assert [lvl.rungs for lvl in levels] == [(), ("lora",), ("lora", "checkpointing"),
                                              ("lora", "checkpointing", "micro-batch")]
    assert [lvl.cost for lvl in levels] == [FREE, QUALITY, QUALITY, QUALITY]
    last = levels[-1]
    assert last.candidate.lora is not None and last.candidate.checkpointing and last.vary_batch


def test_climb_skips_rungs_that_do_not_apply():
    levels = climb(state(device="cpu", checkpointing=True), resolve_ladder(None))
    names = [lvl.rungs[-1] for lvl in levels[1:]]
    assert "expandable-segments" not in names and "checkpointing" not in names
    # Liger's rung applies to the level; the search leaves it out on the CPU, with a note (usable_rungs)
    assert names == ["liger-kernels", "micro-batch", "bf16-weights", "optimizer-8bit", "lora", "quant-8bit",
                     "quant-4bit", "shorter-length"]


# -- each rung --------------------------------------------------------------------------------------------------
def test_expandable_segments():
    applied = ExpandableSegments().apply(state())
    assert dict(applied.candidate.env) == {ALLOC_ENV: "expandable_segments:True"}
    assert applied.cost == FREE and applied.rungs == ("expandable-segments",)
    assert ExpandableSegments().apply(state(device="cpu")) is None
    assert ExpandableSegments().apply(applied) is None
    # the user's allocator setting (their file's env:): the rung adds its option to theirs (issue 39)
    merged = ExpandableSegments().apply(state(env=((ALLOC_ENV, "backend:native"),)))
    assert dict(merged.candidate.env) == {ALLOC_ENV: "backend:native,expandable_segments:True"}
    assert ExpandableSegments().apply(state(env=((ALLOC_ENV, "backend:cudaMallocAsync"),))) is None


def test_micro_batch_rung():
    applied = MicroBatch().apply(state())
    assert applied.vary_batch and applied.cost == SPEED and applied.candidate.micro_batch == 8
    assert MicroBatch().apply(applied) is None
    assert MicroBatch().apply(state(micro_batch=1, grad_accum=1)) is None  # effective batch 1


def test_checkpointing_rung():
    applied = GradientCheckpointing().apply(state())
    assert applied.candidate.checkpointing and applied.cost == SPEED
    assert GradientCheckpointing().apply(state(checkpointing=True)) is None


def test_optimizer_rung():
    applied = EightBitOptimizer().apply(state())
    assert applied.candidate.optim == EIGHT_BIT_ADAMW and applied.cost == QUALITY
    assert EightBitOptimizer().apply(applied) is None


def test_lora_rung():
    applied = Lora().apply(state())
    assert applied.candidate.lora == LoraSettings() and applied.cost == QUALITY
    assert Lora().apply(applied) is None
    custom = Lora(LoraSettings(r=4, alpha=8)).apply(state())
    assert custom.candidate.lora.r == 4


def test_quantization_rungs():
    q8 = QuantizedBase(8).apply(state())
    assert q8.candidate.quantization == "8bit" and q8.candidate.lora == LoraSettings()
    assert q8.rungs == ("quant-8bit",)
    q4 = QuantizedBase(4).apply(q8)
    assert q4.candidate.quantization == "4bit" and q4.rungs == ("quant-8bit", "quant-4bit")
    assert QuantizedBase(8).apply(q4) is None  # never back up to 8-bit
    assert QuantizedBase(4).apply(q4) is None
    keeps = QuantizedBase(8).apply(state(lora=LoraSettings(r=4)))
    assert keeps.candidate.lora.r == 4  # an existing LoRA is kept
    with pytest.raises(ValueError, match="3"):
        QuantizedBase(3)


def test_shorter_length_rung():
    applied = ShorterSequences().apply(state(min_length=128))
    assert applied.vary_length and applied.cost == QUALITY and applied.candidate.max_length == 512
    assert ShorterSequences().apply(applied) is None
    assert ShorterSequences().apply(state(min_length=128, maximize="length")) is None
    assert ShorterSequences().apply(state(min_length=512)) is None


# -- candidates -------------------------------------------------------------------------------------------------
def test_training_args_sets_checkpointing_both_ways():
    from autofit.core._compat import checkpointing_field

    field, other = checkpointing_field(), {"activation_checkpointing", "gradient_checkpointing"}
    for ckpt in (False, True):
        args = candidate(checkpointing=ckpt, micro_batch=2, grad_accum=4).training_args()
        assert args[field] is ckpt
        assert not (other - {field}) & set(args)  # one name only
        assert args["per_device_train_batch_size"] == 2 and args["gradient_accumulation_steps"] == 4
        assert args["max_length"] == 512
        assert "optim" not in args


def test_training_args_cpu_and_optim_and_user_args():
    args = candidate(device="cpu", optim=EIGHT_BIT_ADAMW, user_args=(("learning_rate", 1e-4),)).training_args()
    assert args["use_cpu"] is True and args["bf16"] is False
    assert args["optim"] == EIGHT_BIT_ADAMW and args["learning_rate"] == 1e-4
    cuda = candidate().training_args()
    assert "use_cpu" not in cuda and "bf16" not in cuda


def test_training_args_probe_keys_only_with_probe_settings():
    probe_keys = {"output_dir", "max_steps", "save_strategy", "report_to", "logging_steps"}
    assert not probe_keys & set(candidate().training_args())
    args = candidate(probe=ProbeSettings(steps=3, output_dir="/tmp/x")).training_args()
    assert probe_keys <= set(args)
    assert args["max_steps"] == 3 and args["output_dir"] == "/tmp/x" and args["save_strategy"] == "no"


def test_to_dict_from_dict_round_trip_through_json():
    c = candidate(
        checkpointing=True, optim=EIGHT_BIT_ADAMW, lora=LoraSettings(r=8), quantization="4bit",
        env=((ALLOC_ENV, "expandable_segments:True"),), rungs=("lora", "quant-4bit"),
        user_args=(("learning_rate", 2e-5), ("seed", 3)), real_weights=True,
    )
    data = json.loads(json.dumps(c.to_dict()))
    assert "probe" not in data
    back = Candidate.from_dict(data)
    assert back == c and back.key() == c.key()
    assert isinstance(back.lora, LoraSettings) and isinstance(back.env, tuple) and isinstance(back.rungs, tuple)


def test_key_is_stable_and_ignores_rungs_and_probe():
    c = candidate()
    assert c.key() == candidate().key()
    assert len(c.key()) == 16 and int(c.key(), 16) >= 0
    assert c.with_rung("micro-batch").key() == c.key()
    assert c.replace(rungs=("a", "b")).key() == c.key()
    assert c.replace(probe=ProbeSettings(2, "/tmp/p")).key() == c.key()
    for change in (dict(micro_batch=4, grad_accum=2), dict(max_length=256), dict(checkpointing=True),
                   dict(optim=EIGHT_BIT_ADAMW), dict(lora=LoraSettings()), dict(quantization="8bit"),
                   dict(device="cpu"), dict(user_args=(("seed", 1),))):
        assert c.replace(**change).key() != c.key(), change


def test_describe_and_effective_batch():
    c = candidate(micro_batch=2, grad_accum=4, checkpointing=True, lora=LoraSettings())
    assert c.effective_batch == 8 and c.tokens_per_step == 8 * 512
    assert c.describe() == "mb=2x4 len=512 ckpt lora16"


def test_the_users_own_deepspeed_file_is_named_deepspeed_not_data_parallel():
    own = candidate(ranks=2, user_args=(("deepspeed", {"zero_optimization": {"stage": 3}}),))
    assert own.describe() == "mb=8x1x2 len=512 deepspeed"
    assert own.replace(ranks=1).describe() == "mb=8x1 len=512 deepspeed"  # ZeRO on one GPU is an engine too
    assert own.replace(user_args=()).describe() == "mb=8x1x2 len=512 ddp"
    assert own.replace(sharding="zero2").describe() == "mb=8x1x2 len=512 zero2"  # autofit's engine replaces it


def test_the_engine_facts_a_candidate_answers():
    # optimizer_offload: the offload rung's engine only, not a sharding that offloads; named_engine: the engine a rung
    # named (offload before sharding), never data parallel's, which engine alone adds on several ranks
    plain = candidate()
    assert (plain.optimizer_offload, plain.named_engine, plain.engine) == (False, None, None)
    assert (plain.replace(ranks=2).named_engine, plain.replace(ranks=2).engine) == (None, "ddp")
    sharded = plain.replace(ranks=4, sharding="zero3-offload")
    assert (sharded.optimizer_offload, sharded.named_engine, sharded.engine) == (False, *["zero3-offload"] * 2)
    offloaded = sharded.replace(offload="zero2-offload")
    assert (offloaded.optimizer_offload, offloaded.named_engine, offloaded.engine) == (True, *["zero2-offload"] * 2)


# -- outcomes ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("exc, outcome", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), Outcome.OOM),
    (RuntimeError("CUDA error: out of memory"), Outcome.OOM),
    (RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"), Outcome.OOM),
    (ValueError("--optim adamw_bnb_8bit requires bitsandbytes"), Outcome.INVALID),
    (TypeError("unexpected keyword"), Outcome.INVALID),
    (ImportError("no module named bitsandbytes"), Outcome.INVALID),
    (RuntimeError("boom"), Outcome.CRASH),
    (KeyError("x"), Outcome.CRASH),
])
def test_classify_exception(exc, outcome):
    assert classify_exception(exc)[0] is outcome


def test_classify_exit():
    timeout = classify_exit(None, timed_out=True)
    assert timeout.outcome is Outcome.TIMEOUT and "time limit" in timeout.error
    killed = classify_exit(-signal.SIGKILL, timed_out=False)
    assert killed.outcome is Outcome.CRASH and "SIGKILL" in killed.error and "host memory" in killed.error
    segv = classify_exit(-signal.SIGSEGV, timed_out=False)
    assert segv.outcome is Outcome.CRASH and "SIGSEGV" in segv.error and "host memory" not in segv.error
    code = classify_exit(1, timed_out=False)
    assert code.outcome is Outcome.CRASH and "code 1" in code.error


def test_probe_result_round_trip():
    result = ProbeResult(Outcome.OOM, peak_bytes=5, phase_peaks={"forward": 3}, error="x", error_phase="forward")
    back = ProbeResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back == result and back.outcome is Outcome.OOM and not back.fits
    assert ProbeResult(Outcome.OK).fits


# -- factories --------------------------------------------------------------------------------------------------
def module_level_factory(candidate):
    return candidate


def test_any_callable_crosses_by_value():
    offset = 3

    def nested(candidate):
        return candidate.micro_batch + offset

    c = candidate(micro_batch=2)
    for factory, expected in ((lambda cand: cand.micro_batch * 10, 20), (nested, 5), (module_level_factory, c)):
        payload = prepare_factory(factory)
        assert payload.pickled is not None and not payload.builtin
        assert payload.load()(c) == expected  # what a probe process gets back


def test_builtin_and_named_factories():
    for name in ("sft", "autofit.probe.algos.sft:build_trainer"):
        payload = prepare_factory(name)
        assert payload.builtin and payload.ref == "autofit.probe.algos.sft:build_trainer" and payload.identity == ""
    named = prepare_factory("test_units:module_level_factory")
    assert not named.builtin and named.ref == "test_units:module_level_factory"
    assert named.identity == identity(module_level_factory)  # the study is the same, by name or by value


def test_identity_does_not_depend_on_the_module_it_was_found_in():
    source = "def make(candidate):\n    return candidate.micro_batch * 2\n"
    found_as = {}
    for module in ("__main__", "my_trainers"):
        namespace = {"__name__": module}
        exec(compile(source, "train.py", "exec"), namespace)
        found_as[module] = identity(namespace["make"])
    assert found_as["__main__"] == found_as["my_trainers"]
    exec(compile(source.replace("* 2", "* 3"), "train.py", "exec"), namespace)
    assert identity(namespace["make"]) != found_as["my_trainers"]  # other code, another study


def test_a_factory_that_cannot_cross_is_refused_before_any_probe(tmp_path):
    handle = open(tmp_path / "data.txt", "w")
    try:
        with pytest.raises(FactoryError, match="cannot be sent to a probe process: PicklingError: Cannot pickle files"):
            prepare_factory(lambda candidate: handle.write("x"))
    finally:
        handle.close()
    with pytest.raises(FactoryError, match="not callable"):
        prepare_factory(42)


@pytest.mark.parametrize("ref, message", [
    ("no_such_module_xyz:fn", "cannot be imported"),
    ("autofit.probe.algos.sft:no_such_function", "cannot be imported"),
    ("notaref", "not of the form"),
])
def test_bad_factory_names(ref, message):
    with pytest.raises(FactoryError, match=message):
        prepare_factory(ref)


# -- model registry ---------------------------------------------------------------------------------------------
@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))


def test_resolve_bundled_models(empty_hub_cache):
    tiny = resolve_model("tiny-qwen2")
    assert tiny.model_type == "qwen2" and tiny.local_path is None
    qwen = resolve_model("Qwen/Qwen2.5-0.5B")
    assert qwen.model_type == "qwen2" and qwen.name == "Qwen/Qwen2.5-0.5B"


def test_resolve_local_folder(tmp_path, empty_hub_cache):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    source = resolve_model(str(folder))
    assert source.model_type == "llama" and source.local_path == str(folder.resolve())


def test_resolve_folder_without_config(tmp_path, empty_hub_cache):
    folder = tmp_path / "empty-model"
    folder.mkdir()
    with pytest.raises(UnknownModelError, match="config.json") as err:
        resolve_model(str(folder))
    assert str(folder) in str(err.value)


def test_resolve_unknown_model(empty_hub_cache):
    with pytest.raises(UnknownModelError) as err:
        resolve_model("nobody/no-such-model-xyz")
    assert "'nobody/no-such-model-xyz'" in str(err.value) and "tiny-qwen2" in str(err.value)


def test_resolve_from_hub_cache(tmp_path, empty_hub_cache):
    snap = tmp_path / "hub" / "models--someone--cached-model" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "gemma3_text"}))
    assert resolve_model("someone/cached-model").model_type == "gemma3_text"


# -- regressions: bugs found by these tests and fixed ----------------------------------------------------------
@pytest.mark.parametrize("budget", [0, -5])
def test_spec_rejects_non_positive_budget(budget):
    with pytest.raises(InputError, match=str(budget)):
        spec(budget_bytes=budget)


def test_parse_size_rejects_sizes_that_round_to_zero():
    with pytest.raises(InputError, match="0.4B"):
        parse_size("0.4B")


def test_bf16_weights_rung():
    from autofit.rungs import Bf16Weights

    applied = Bf16Weights().apply(state())
    assert applied.candidate.dtype == "bfloat16" and applied.cost == QUALITY
    assert applied.candidate.training_args()["model_init_kwargs"] == {"dtype": "bfloat16"}
    assert Bf16Weights().apply(applied) is None
    # the user decided: --dtype, or their own model_init_kwargs (kept, merged with what the candidate adds)
    assert Bf16Weights().apply(state(dtype="float32")) is None
    mine = state(user_args=(("model_init_kwargs", {"dtype": "float32", "attn_implementation": "eager"}),))
    assert Bf16Weights().apply(mine) is None
    kwargs = state(user_args=(("model_init_kwargs", {"attn_implementation": "eager"}),))
    assert Bf16Weights().apply(kwargs).candidate.training_args()["model_init_kwargs"] == {
        "attn_implementation": "eager", "dtype": "bfloat16"}


def test_a_candidates_key_is_unchanged_without_a_dtype():
    # studies stored before the dtype field keep their keys (and are resumed): this key was computed by the code of
    # commit 6704e3f, before the field existed
    assert candidate().key() == "77f078bef43b96cf"
    assert candidate(dtype="bfloat16").key() != "77f078bef43b96cf"


def test_a_quoted_error_is_cut_at_a_words_end():
    """Issue 31, item 7: probe lines were cut mid-word ("(phase forward_back")."""
    from autofit.core import clip

    error = "CUDA out of memory while the probe ran (phase forward_backward, micro-batch 8): tried to allocate 2 GiB"
    cut = clip(error, 60)
    assert len(cut) <= 60 and cut.endswith("...") and error.startswith(cut[:-3])
    assert cut[:-3].split()[-1] in error.split()  # whole words only
    assert clip(error, len(error)) == error
    assert clip("x" * 100, 20) == "x" * 17 + "..."  # one long word is cut where it must be
