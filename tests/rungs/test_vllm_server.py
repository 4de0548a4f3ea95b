"""vLLM's server placement as a rung (issue 59, item 2): ``trl vllm-serve`` on the fewest of the node's GPUs that hold
it (tensor parallel), the trainer on the rest with the same effective batch; its ledger, speed and words, and the
quality rungs climbing on from the colocated level before it."""

from __future__ import annotations

import json

from autofit import memory_model as mm
from autofit.core import Candidate
from autofit.export._vllm import server_command, vllm_comments
from autofit.rungs import DEFAULT_LADDER, LadderState, climb
from autofit.rungs.vllm import VllmServer
from tests.fakes import estimate_cli

GIB = 2**30
SHAPE = mm.ModelShape.from_model("Qwen/Qwen2.5-7B")
# the seed report's run: Qwen2.5-7B GRPO on 4 x 24 GB, TRL's 0.3 share; vLLM's context the run's
SEED = Candidate("grpo", "Qwen/Qwen2.5-7B", "cuda", micro_batch=2, grad_accum=1, max_length=512, prompt_length=128,
                 ranks=4, num_generations=2, vllm="colocate", vllm_utilization=0.3, vllm_max_model_length=640,
                 vllm_share_bytes=int(0.3 * 24 * GIB))


def _start(candidate: Candidate, card: int = 24 * GIB) -> LadderState:
    return LadderState(candidate, vllm_need=lambda c: int(mm.vllm_need(c, SHAPE)),
                       vllm_server_fits=lambda c, gpus: mm.server_fits(c, SHAPE, card, gpus))


def test_the_server_takes_the_fewest_gpus_the_batch_divides_over_the_rest():
    # 8 sequences a step on 4 GPUs: one server GPU would leave 3 ranks, which 8 does not divide; two leave 2
    placed = VllmServer().apply(_start(SEED))
    assert placed is not None
    c = placed.candidate
    assert (c.vllm, c.vllm_server_gpus, c.ranks) == ("server", 2, 2)
    assert c.effective_batch == SEED.effective_batch and placed.per_rank(2) == 4
    assert c.vllm_share_bytes is None and not c.vllm_sleep and c.rungs[-1] == "vllm-server"
    # 12 sequences a step: one GPU serves (7B in bf16 is 14.2 GiB of a 24 GiB card), three train 4 each
    three = VllmServer().apply(_start(SEED.replace(micro_batch=3)))
    assert three is not None and (three.candidate.vllm_server_gpus, three.candidate.ranks) == (1, 3)
    assert three.per_rank(3) == 4 and three.candidate.effective_batch == 12


def test_the_server_needs_room_and_a_node_of_several_gpus():
    # a card too small for the weights even split over the GPUs the node can spare
    assert VllmServer().apply(_start(SEED, card=2 * GIB)) is None
    assert VllmServer().apply(_start(SEED.replace(ranks=1))) is None
    # the user's file chose the mode; a run already in server mode
    assert VllmServer().apply(_start(SEED.replace(user_args=(("vllm_mode", "colocate"),)))) is None
    assert VllmServer().apply(_start(SEED.replace(vllm="server", vllm_utilization=None,
                                                  vllm_share_bytes=None))) is None
    # tensor parallel sizes vLLM refuses for the model (28 attention heads split by 1, 2 or 4, not by 8)
    assert mm.server_share(SEED, SHAPE, 24 * GIB, 8) is None and mm.server_share(SEED, SHAPE, 24 * GIB, 4)


def test_its_ledger_holds_no_vllm_share_and_its_speed_counts_the_server_generation():
    placed = VllmServer().apply(_start(SEED)).candidate
    colocated = SEED.replace(vllm_utilization=0.71, vllm_share_bytes=int(0.71 * 24 * GIB))
    assert mm.vllm_term(placed, SHAPE) == 0 and mm.vllm_term(colocated, SHAPE) > 17 * GIB
    assert mm.predict(placed, SHAPE).total < mm.predict(colocated, SHAPE).total
    served = mm.predict_speed(placed, SHAPE, mm.card_named("RTX3090"))
    assert served.terms["vLLM generation"] > 0 and served.terms["vLLM weight sync"] > 0
    # tensor parallel 2 reads half the weights per GPU a decode step: faster than one GPU's generation of the batch
    one = mm.predict_speed(placed.replace(vllm_server_gpus=1), SHAPE, mm.card_named("RTX3090"))
    assert served.terms["vLLM generation"] < one.terms["vLLM generation"]


def test_the_quality_rungs_climb_on_from_the_colocated_level():
    levels = climb(_start(SEED), list(DEFAULT_LADDER))
    names = [level.rungs[-1] if level.rungs else "" for level in levels]
    server = names.index("vllm-server")
    assert names[server - 1] in ("zero3-offload", "fsdp2-offload")  # the speed class's last
    for level in levels[server + 1:]:
        assert level.candidate.vllm == "colocate" and "vllm-server" not in level.rungs
        assert level.candidate.ranks == 4 and level.rank_batch is None


def test_best_yaml_says_where_the_server_and_the_trainer_run():
    placed = VllmServer().apply(_start(SEED)).candidate
    assert server_command(placed, "Qwen/Qwen2.5-7B") == (
        "CUDA_VISIBLE_DEVICES=2,3 trl vllm-serve --model Qwen/Qwen2.5-7B --tensor_parallel_size 2 "
        "--max_model_len 640 --gpu_memory_utilization 0.9")
    lines = vllm_comments(None, placed, "Qwen/Qwen2.5-7B")  # type: ignore[arg-type]  # the server's: no report read
    assert "on 2 of the node's 4 GPUs" in lines[0] and "CUDA_VISIBLE_DEVICES=0,1 before the launch line" in lines[1]


def test_the_seed_case_estimate_names_the_server_level_with_its_gpus_and_speed():
    """Through the door a user types: the 4 x RTX 3090 estimate has a vllm-server level, vLLM on 2 GPUs, the
    trainer's 2 ranks holding no share; its host RAM and speed in the table and in --json."""
    args = ("--model", "Qwen/Qwen2.5-7B", "--algo", "grpo", "--gpus", "4", "--gpu-memory", "RTX3090",
            "--use-vllm", "colocate")
    text = estimate_cli(*args)
    row = next(line for line in text.splitlines() if "+vllm-server" in line and line.strip()[0].isdigit())
    cells = row.split()
    assert cells[cells.index("+vllm-server") + 1:][:2] == ["-vllm-share", "-vllm-sleep"]
    assert cells[-1].isdigit() and int(cells[-1]) > 0  # tok/s
    data = json.loads(estimate_cli(*args, "--json"))
    level = next(lv for lv in data["estimates"][0]["levels"] if lv["adds"] == "vllm-server")
    placed = level["configuration"]
    assert (placed["vllm"], placed["vllm_server_gpus"], placed["ranks"]) == ("server", 2, 2)
    assert level["leaves_out"] == ["vllm-share", "vllm-sleep"] and level["terms"]["generation"]["bytes"] == 0
    assert level["speed"]["tokens_per_second"] > 0 and level["host"]["bytes"] > 0  # zero3-offload's host RAM
