"""The vLLM rungs (issue 46): vLLM's context and its share of the card, as the ledger sizes them; and the server's
supervisor, which takes vLLM's processes with it whatever way the probe ends (no vLLM needed: a sleeping child stands
for the server). The searches whose probes run vLLM are the vLLM lane's (tests/vllm_lane, make test-vllm)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from autofit import memory_model as mm
from autofit.core import Candidate
from autofit.rungs import LadderState, VllmContext, VllmShare, climb
from autofit.rungs.vllm._probe import _stop_group, supervised

GB = 10**9
SHAPE = mm.ModelShape.from_model("Qwen/Qwen2.5-7B")
SEED = Candidate("grpo", "Qwen/Qwen2.5-7B", "cuda", micro_batch=2, grad_accum=1, max_length=512, prompt_length=128,
                 ranks=4, num_generations=2, vllm="colocate", vllm_utilization=0.3,
                 vllm_share_bytes=int(0.3 * 24 * 2**30))


def _start(candidate: Candidate) -> LadderState:
    return LadderState(candidate, vllm_need=lambda c: int(mm.vllm_need(c, SHAPE)))


def test_the_context_and_the_share_are_what_vllm_needs_of_the_card():
    """The seed report's run: Qwen2.5-7B GRPO on 4 x 24 GB with TRL's 0.3: vLLM needs a KV cache of one sequence of
    the model's whole context to start, and its weights alone are more than 0.3 of the card."""
    base, context, share = climb(_start(SEED), [VllmContext(), VllmShare()])
    assert base.candidate.vllm_max_model_length is None
    assert context.candidate.vllm_max_model_length == 640  # the run's prompt + completion
    need = mm.vllm_need(context.candidate, SHAPE)
    assert share.candidate.vllm_share_bytes >= need * 1.1 and share.candidate.vllm_utilization < 0.8
    assert share.candidate.vllm_share_bytes == pytest.approx(share.candidate.vllm_utilization * 24 * 2**30, abs=64)
    # the ledger: at TRL's share vLLM cannot start, so its column is what it needs, not what it was given; at the
    # rung's share, the share, and what vLLM spends beyond it (the band its accounting misses, at its high end)
    beyond = mm.VLLM_UNMODELLED_BAND[1]
    assert mm.vllm_term(base.candidate, SHAPE) > base.candidate.vllm_share_bytes + beyond
    assert mm.vllm_term(share.candidate, SHAPE) == share.candidate.vllm_share_bytes + beyond
    assert share.cost == "free" and VllmShare().trade(share.candidate, {}).startswith("vLLM takes")


def test_a_colocated_vllm_takes_a_4bit_base_and_not_an_8bit_one():
    """TRL's colocated vLLM refuses a bitsandbytes 8-bit model ("vLLM does not support in-flight 8-bit
    quantization.") and starts a 4-bit one with quantization="bitsandbytes": the 8-bit rung is not a level there,
    and vLLM's weights follow the 4-bit base."""
    from autofit.rungs import QuantizedBase

    assert QuantizedBase(8).apply(_start(SEED)) is None
    four = QuantizedBase(4).apply(_start(SEED))
    assert four is not None and four.candidate.quantization == "4bit"
    for other in (SEED.replace(vllm="server", vllm_utilization=None, vllm_share_bytes=None),
                  SEED.replace(vllm=None, vllm_utilization=None, vllm_share_bytes=None)):
        assert QuantizedBase(8).apply(_start(other)) is not None
    bf16, nf4 = mm.candidate_share(SEED, SHAPE), mm.candidate_share(four.candidate, SHAPE)
    counts = mm.param_counts(SHAPE, "grpo")
    assert bf16.weights == counts.total * 2
    assert nf4.weights == pytest.approx(counts.linear * (0.5 + 4 / 64) + (counts.total - counts.linear) * 2)
    assert nf4.weights < bf16.weights / 2
    assert (bf16.weight_format, nf4.weight_format) == ("bf16", "NF4 linear layers, the rest bf16")


def test_the_rungs_leave_what_they_do_not_apply_to():
    plain = SEED.replace(vllm=None, vllm_utilization=None, vllm_share_bytes=None)
    assert VllmContext().apply(_start(plain)) is None and VllmShare().apply(_start(plain)) is None
    server = SEED.replace(vllm="server", vllm_utilization=None, vllm_share_bytes=None)
    assert VllmShare().apply(_start(server)) is None
    assert VllmShare().apply(LadderState(SEED)) is None  # no model known: no share to size


PROBE = """
import os, subprocess, sys, time
sys.path[:0] = {path!r}
from autofit.rungs.vllm._probe import supervised
server = subprocess.Popen(supervised(["sleep", "300"], grace_s=2), start_new_session=True)
print(server.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _group(pgid: int):
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _in_group(int(entry), pgid)]


def _in_group(pid: int, pgid: int) -> bool:
    try:
        return os.getpgid(pid) == pgid and _alive(pid)
    except ProcessLookupError:
        return False


def test_a_probe_killed_at_its_time_limit_takes_the_server_with_it():
    probe = subprocess.Popen([sys.executable, "-c", PROBE.format(path=sys.path)], stdout=subprocess.PIPE, text=True)
    leader = int(probe.stdout.readline())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(_group(leader)) < 2:  # the supervisor and its server
        time.sleep(0.1)
    assert len(_group(leader)) == 2
    probe.send_signal(signal.SIGKILL)  # as the runner ends a probe at its time limit
    probe.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _group(leader):
        time.sleep(0.2)
    assert _group(leader) == []


@pytest.mark.parametrize("stubborn", [False, True])
def test_the_probe_stops_the_server_group_when_it_ends(stubborn):
    command = ["sh", "-c", "trap '' TERM; sleep 300"] if stubborn else ["sleep", "300"]
    server = subprocess.Popen(supervised(command, grace_s=1), start_new_session=True)
    time.sleep(1.0)
    started = time.monotonic()
    _stop_group(server)
    assert _group(server.pid) == [] and time.monotonic() - started < 30
