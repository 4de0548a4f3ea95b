"""vLLM's sleep mode as a rung (issue 59, item 2): TRL's ``vllm_enable_sleep_mode`` (sleep level 2 after each
generation) releases vLLM's weights and KV cache while the trainer trains, so the trainer's phases hold only what vLLM
keeps asleep (non-torch memory, CUDA graphs, what it spends beyond its share) and two phases of their own hold the
rest: the weight sync (vLLM's weights woken beside the trainer's; under ZeRO-3 with LoRA the whole model gathered to
merge the adapters) and the generation (the whole share beside the trainer's weights and optimizer states)."""

from __future__ import annotations

import pytest
from fakes import estimate_cli

from autofit import memory_model as mm
from autofit.core import Candidate, LoraSettings
from autofit.memory_model import VLLM_UNMODELLED_BAND, card_named
from autofit.rungs import resolve_ladder, rung_named, usable_rungs

GIB = 2**30
SHAPE_7B = "Qwen/Qwen2.5-7B"


def colocated(**changes) -> Candidate:
    base = dict(algo="grpo", model=SHAPE_7B, device="cuda", micro_batch=2, grad_accum=1, max_length=512,
                prompt_length=128, vllm="colocate", vllm_utilization=0.7, vllm_share_bytes=int(0.7 * 80 * GIB),
                vllm_max_model_length=640)
    return Candidate(**{**base, **changes})


def by_phase(candidate: Candidate) -> dict:
    return {ledger.phase: ledger for ledger in mm.phase_ledgers(candidate, mm.ModelShape.from_model(SHAPE_7B))}


def test_asleep_the_trainers_phases_hold_only_what_vllm_keeps_and_the_generation_holds_the_share():
    shape = mm.ModelShape.from_model(SHAPE_7B)
    awake, asleep = by_phase(colocated()), by_phase(colocated(vllm_sleep=True))
    share = mm.candidate_share(colocated(), shape)
    kept = share.non_torch + share.cuda_graphs + VLLM_UNMODELLED_BAND[1]
    for phase in ("train", "backward", "step"):
        assert awake[phase].generation == pytest.approx(mm.vllm_term(colocated(), shape))
        assert asleep[phase].generation == pytest.approx(kept)
        assert asleep[phase].total < awake[phase].total - 0.6 * 80 * GIB  # the share is gone while it trains
    assert "generation" not in awake and set(asleep) >= {"generation", "weight_sync"}
    generation = asleep["generation"]
    assert generation.generation == pytest.approx(mm.vllm_term(colocated(), shape))
    assert generation.activations == 0 and generation.gradients == 0 and generation.optimizer > 0
    sync = asleep["weight_sync"]
    assert sync.generation == pytest.approx(kept + share.weights)
    assert sync.total < generation.total  # one GPU, no LoRA under ZeRO-3: nothing gathered beside vLLM's weights


def test_the_peak_moves_to_the_generation_and_sleep_never_adds_memory():
    for changes in ({}, {"micro_batch": 8}, {"vllm_utilization": 0.4, "vllm_share_bytes": int(0.4 * 80 * GIB)}):
        awake, asleep = mm.predict(colocated(**changes)), mm.predict(colocated(vllm_sleep=True, **changes))
        assert asleep.total <= awake.total, changes
    assert mm.predict(colocated(vllm_sleep=True)).phase == "generation"


def test_zero3_with_lora_gathers_the_whole_model_at_the_weight_sync_asleep_or_not():
    """TRL gathers every parameter at once to merge the adapters under ZeRO-3 (``_iter_named_params``); FSDP's
    post-order traversal gathers one module at a time."""
    lora = dict(ranks=4, sharding="zero3", lora=LoraSettings(), vllm_share_bytes=int(0.7 * 24 * GIB))
    for sleep in (False, True):
        phases = by_phase(colocated(vllm_sleep=sleep, **lora))
        assert phases["weight_sync"].weights == pytest.approx(4 * phases["train"].weights, rel=0.01)
    assert "weight_sync" not in by_phase(colocated(**{**lora, "sharding": "fsdp2"}))


def test_the_rung_applies_to_a_colocated_vllm_on_cuda_and_not_where_the_user_decided():
    rung = rung_named("vllm-sleep")
    assert rung is not None and rung.cost == "speed"
    assert rung.unavailable("cuda") is None and "CUDA's only" in rung.unavailable("cpu")
    ladder = resolve_ladder(None)
    kept, notes = usable_rungs(ladder, "cpu")
    assert "vllm-sleep" not in [r.name for r in kept] and any("vllm-sleep" in note for note in notes)
    assert [r.name for r in ladder].index("vllm-sleep") < [r.name for r in ladder].index("micro-batch")
    assert colocated().replace(vllm_sleep=True).describe().endswith("/sleep")
    assert colocated(vllm_sleep=True).training_args()["vllm_enable_sleep_mode"] is True
    assert "vllm_enable_sleep_mode" not in colocated().training_args()
    assert "vllm_enable_sleep_mode" not in colocated(vllm="server", vllm_sleep=True).training_args()


def test_the_seeds_case_offers_sleep_with_its_speed_and_no_host_memory():
    """Qwen2.5-7B GRPO with a colocated vLLM on 4 x RTX 3090: the sleep level is a row of the table with its speed,
    its peak below the share-sized level's, no host memory; the wake-up priced once a generation round."""
    text = estimate_cli("--model", SHAPE_7B, "--algo", "grpo", "--gpu-memory", "RTX3090", "--gpus", "4", "--use-vllm",
                     "colocate", "--max-completion-length", "512")
    rows = {line.split()[1]: line.split() for line in text.splitlines() if line[:3].strip().isdigit()}
    sleep, share = rows["+vllm-sleep"], rows["+vllm-share"]
    assert float(sleep[4]) < float(share[4]) and sleep[-2] == "-" and sleep[-1].replace(",", "").isdigit()
    use = text.splitlines()[1]
    assert use.startswith("use: level ") and "/ctx640/sleep" in use  # the answer sleeps, its context sized
    candidate = colocated(vllm_sleep=True, ranks=4, vllm_share_bytes=int(0.7 * 24 * GIB))
    speed = mm.predict_speed(candidate, mm.ModelShape.from_model(SHAPE_7B), card_named("RTX3090"))
    assert speed.terms["vLLM wake-up"] > 0


def test_a_file_that_sleeps_is_estimated_asleep_and_the_rung_leaves_it(tmp_path):
    config = tmp_path / "grpo.yaml"
    config.write_text(f"model_name_or_path: {SHAPE_7B}\nuse_vllm: true\nvllm_mode: colocate\n"
                      "vllm_gpu_memory_utilization: 0.7\nvllm_enable_sleep_mode: true\nvllm_max_model_length: 640\n"
                      "per_device_train_batch_size: 2\nnum_generations: 2\nmax_completion_length: 512\n")
    text = estimate_cli("--algo", "grpo", "--config", str(config), "--gpu-memory", "H100")
    run = next(line for line in text.splitlines() if line.startswith("your run ("))
    assert "/sleep" in run
    assert "+vllm-sleep" not in text  # the user decided
    awake = tmp_path / "awake.yaml"
    awake.write_text(config.read_text().replace("vllm_enable_sleep_mode: true", "vllm_enable_sleep_mode: false"))
    text = estimate_cli("--algo", "grpo", "--config", str(awake), "--gpu-memory", "H100")
    assert "/sleep" not in next(line for line in text.splitlines() if line.startswith("your run (")) and \
        "+vllm-sleep" not in text
