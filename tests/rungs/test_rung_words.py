"""A rung carries its own words (issue 38): the sentence of what the user trades for it, and best.yaml's comment on
every key it writes. A built-in rung that changes a key without a comment would leave best.yaml saying "yours" of
autofit's own change; one without a sentence would drop out of best.json's trades."""

from typing import Any, Dict, List, Optional

import pytest

from autofit import memory_model as mm
from autofit.core import Candidate, LoraSettings
from autofit.export import trades
from autofit.export._answer import model_args
from autofit.export._words import why
from autofit.rungs import DEFAULT_LADDER, RUNGS, LadderState, Rung, register

MODEL = "Qwen/Qwen2.5-0.5B"  # bundled: no hub
BUILT_IN: List[Rung] = list({id(r): r for r in (*DEFAULT_LADDER, *RUNGS.values())}.values())
ASKED = 512


def _bases() -> List[LadderState]:
    """Starting levels between them every built-in rung applies to (sharding needs ranks, the allocator CUDA)."""
    plain = dict(algo="sft", model=MODEL, micro_batch=4, grad_accum=2, max_length=ASKED)
    shape = mm.ModelShape.from_model(MODEL)
    vllm = LadderState(Candidate(algo="grpo", model=MODEL, device="cuda", micro_batch=4, grad_accum=2, max_length=ASKED,
                                 prompt_length=64, vllm="colocate", vllm_utilization=0.3,
                                 vllm_share_bytes=int(0.3 * 80e9), ranks=2),
                       vllm_need=lambda c: int(mm.vllm_need(c, shape)),
                       # GRPO with a colocated vLLM, on two GPUs (the server rung's)
                       vllm_server_fits=lambda c, gpus: mm.server_fits(c, shape, int(80e9), gpus))
    dpo = LadderState(Candidate(**{**plain, "algo": "dpo"}, device="cuda"))  # type: ignore[arg-type]
    return [LadderState(Candidate(device=device, ranks=ranks, **plain), min_length=64)  # type: ignore[arg-type]
            for device in ("cuda", "cpu") for ranks in (1, 2)] + [vllm, dpo]


def _exported(candidate: Candidate) -> Dict[str, Any]:
    """Every key the export writes for ``candidate`` (``env.NAME`` for its environment)."""
    args = {**model_args(candidate), **candidate.training_args()}
    args.update({f"env.{key}": value for key, value in candidate.env})
    return args


def _searched(before: LadderState, after: LadderState) -> Candidate:
    """The candidate a search at ``after`` can pick: the micro-batch and length it may turn, turned."""
    candidate = after.candidate
    if after.vary_batch and not before.vary_batch:
        candidate = candidate.replace(micro_batch=1, grad_accum=candidate.micro_batch * candidate.grad_accum)
    if after.vary_length and not before.vary_length:
        candidate = candidate.replace(max_length=after.min_length)
    return candidate


def _applied(rung: Rung):
    for base in _bases():
        after = rung.apply(base)
        if after is not None:
            return base, after
    pytest.fail(f"rung {rung.name} applies to none of the test's starting levels")


def _id(rung: Rung) -> str:
    return rung.name + ("-simulated" if getattr(rung, "on_simulated_device", False) else "")


@pytest.mark.parametrize("rung", BUILT_IN, ids=_id)
def test_every_built_in_rung_comments_each_key_it_writes_and_says_what_it_trades(rung):
    base, after = _applied(rung)
    candidate = _searched(base, after)
    before, now = _exported(base.candidate), _exported(candidate)
    changed = [key for key, value in now.items() if key not in before or before[key] != value]
    assert changed or rung.name.startswith(("zero", "fsdp", "optimizer-offload")), rung.name  # engines: files only
    for key in changed:
        assert rung.comment(key, candidate), f"{rung.name} writes {key} without a comment"  # type: ignore[attr-defined]
        assert why(key, candidate, ASKED, "batch") != "yours", (rung.name, key)
    assert rung.trade(candidate, {"asked_length": ASKED}), f"{rung.name} says nothing of what it trades"  # type: ignore[attr-defined]
    assert len(trades(candidate, ASKED)) == len(candidate.rungs)


def test_the_comment_is_the_rung_s_and_what_no_rung_decided_is_said_by_key():
    candidate = Candidate(algo="sft", model=MODEL, device="cuda", micro_batch=2, grad_accum=4, max_length=ASKED,
                          checkpointing=True, optim="adamw_bnb_8bit", rungs=("micro-batch", "checkpointing"))
    assert why("per_device_train_batch_size", candidate, ASKED, "batch") == "micro-batch (effective batch kept)"
    assert why("gradient_accumulation_steps", candidate.replace(rungs=()), ASKED, "batch") == "effective batch"
    assert why("activation_checkpointing", candidate, ASKED, "batch") == "checkpointing"
    assert why("activation_checkpointing", candidate.replace(checkpointing=False, rungs=()), ASKED, "batch") == (
        "baseline: off is fastest and fits")
    assert why("optim", candidate, ASKED, "batch") == "yours"  # no 8-bit rung climbed: the user's own optimizer
    assert why("max_length", candidate, ASKED, "batch") == "--max-length"
    assert why("max_length", candidate, ASKED, "length") == "longest that fits (--maximize length)"
    own = candidate.replace(lora=LoraSettings(), quantization="4bit")  # the user's trainer adds them (measured)
    assert why("lora_r", own, ASKED, "batch") == "your trainer's own LoRA (measured)"
    assert why("load_in_4bit", own, ASKED, "batch") == "your trainer's own quantization (measured)"
    assert why("dtype", candidate.replace(dtype="bfloat16"), ASKED, "batch") == "--dtype"


def test_a_4_bit_base_says_quant_4bit_though_the_level_climbed_the_8_bit_rung_first():
    from autofit.rungs import climb, resolve_ladder

    level = climb(_bases()[0], resolve_ladder(["quant-8bit", "quant-4bit"]))[-1]
    assert level.rungs == ("quant-8bit", "quant-4bit") and level.candidate.quantization == "4bit"
    said = {key: why(key, level.candidate, ASKED, "batch") for key in ("load_in_4bit", "bnb_4bit_quant_type", "lora_r")}
    assert said == {"load_in_4bit": "quant-4bit", "bnb_4bit_quant_type": "quant-4bit",
                    "lora_r": "quant-8bit"}  # the 8-bit rung brought the LoRA


class _Padding:
    """A rung of another package's, with words of its own and no RungBase."""

    name, cost, help = "padding-free-test", "free", "padding_free=True"

    def apply(self, state: LadderState) -> Optional[LadderState]:
        return state.with_rung(self, candidate_changes={"user_args": (("padding_free", True),)})

    def trade(self, candidate: Candidate, context: Dict[str, Any]) -> str:
        return f"no padding up to {context['asked_length']} tokens"

    def comment(self, key: str, candidate: Candidate) -> Optional[str]:
        return "padding-free-test: no padding tokens" if key == "padding_free" else None


def test_a_registered_rung_speaks_in_its_own_words():
    rung = _Padding()
    register(rung)
    candidate = rung.apply(_bases()[0]).candidate  # type: ignore[union-attr]
    assert trades(candidate, ASKED) == [f"no padding up to {ASKED} tokens"]
    assert why("padding_free", candidate, ASKED, "batch") == "padding-free-test: no padding tokens"
    assert why("learning_rate", candidate, ASKED, "batch") == "yours"
