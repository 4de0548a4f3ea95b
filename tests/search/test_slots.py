"""Probes side by side (issue 49, item 1; autofit.search._slots): the walk's next probes start on free slots, the
search's answer and its probes are the one-at-a-time search's on the same measurements, in fewer rounds, and
verifications run alone. Lightning's tuner tests' way: a fake runner whose memory is a formula, here one that takes
its time, so that probes really overlap."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from fakes import formula_spec, spec_of

from autofit.core import InputError, Outcome
from autofit.probe import ProcessRunner
from autofit.rungs import resolve_ladder
from autofit.search import Search, SlotRunner, probe_slots
from autofit.search._ahead import bisection, branches, next_index
from autofit.search._slots import SlotTable, beside

try:
    from fakes import FormulaRunner, MiB
except ImportError:  # tests/ became a package
    from tests.fakes import FormulaRunner, MiB

PROBE_S = 0.15  # each fake probe's time: long against the search's own work, so probes started together overlap


class TimedFormulaRunner(FormulaRunner):
    """A ``FormulaRunner`` whose probes take ``PROBE_S`` and that counts how many ran at once with each."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.running = 0
        self.crowds = []  # (candidate, steps, probes running at its start, counting itself)

    def run(self, candidate, steps, **plan):
        with self._lock:
            self.running += 1
            self.crowds.append((candidate, steps, self.running))
        try:
            time.sleep(PROBE_S)
            return super().run(candidate, steps, **plan)
        finally:
            with self._lock:
                self.running -= 1


def walk(values_fit, start):
    """The indices ``bisection`` probes where ``values_fit`` says which fit."""
    order, plan = [], bisection(start, len(values_fit) - 1)
    try:
        index = next(plan)
        while True:
            order.append(index)
            index = plan.send(values_fit[index])
    except StopIteration:
        return order


def test_the_plan_is_the_walks_largest_fit_search():
    fit = [True, True, True, False, False, False]
    assert walk(fit, 1) == [1, 2, 5, 3]  # from the prediction up one, then the top, then bisection
    assert walk(fit, 4) == [4, 0, 2, 3]  # predicted too high: down to 0, then bisection
    assert walk([True] * 6, 2) == [2, 3, 5]
    assert walk([False] * 6, 0) == [0]
    assert next_index(1, 5, [(1, True), (2, True)]) == 5
    assert next_index(1, 5, [(1, True), (2, True), (5, False), (3, False)]) is None
    with pytest.raises(ValueError, match="not this walk's"):
        next_index(1, 5, [(2, True)])


def test_branches_are_both_outcomes_nearest_first():
    # about to probe 1 (the predicted start): it fits (then 2) or not (then 0); then what follows each of those
    assert branches(1, 5, [], 1, 2) == [2, 0]
    assert branches(1, 5, [], 1, 3) == [2, 0, 5]
    assert branches(1, 5, [], 1, 10) == [2, 0, 5, 3, 4]  # every index the walk could still ask for
    assert branches(1, 5, [(1, True), (2, True)], 5, 10) == [3, 4]
    assert branches(1, 5, [(1, True), (2, True), (5, False)], 3, 10) == [4]  # 3 fits: 4 next; else done


def test_the_slot_table_gives_each_probe_its_own_devices():
    table = SlotTable(["0", "1", "2"])
    first = table.take(2)
    assert first == ["0", "1"] and table.take(2, wait=False) is None
    assert table.take(1) == ["2"] and table.free == 0
    table.give(first)
    assert table.free == 2 and table.take(2) == ["0", "1"]
    with pytest.raises(ValueError, match="needs 4 devices; 3 are given"):
        table.take(4)
    with pytest.raises(ValueError, match="distinct devices"):
        SlotTable(["0", "0"])


def probe_records(report):
    return [(r.level, r.candidate.key(), r.result.outcome, r.result.peak_bytes, r.result.tokens_per_second)
            for r in report.records if r.kind == "probe"]


@pytest.mark.parametrize("predict", [False, True])
def test_four_slots_find_the_serial_answer_in_fewer_rounds(tmp_path, predict):
    """The default ladder under a budget where checkpointing is needed (a full level walked, then the next)."""
    budget = 620 * MiB  # states 600 MiB: micro-batch 1 (32 MiB of activations) does not fit, checkpointed 2 does
    serial_runner = TimedFormulaRunner(budget)
    serial = Search(formula_spec(tmp_path / "serial", budget, predict=predict), serial_runner,
                    resolve_ladder(None)).run()
    runner = TimedFormulaRunner(budget)
    slots = SlotRunner(runner, ["0", "1", "2", "3"])
    try:
        side_by_side = Search(formula_spec(tmp_path / "slots", budget, predict=predict), slots,
                              resolve_ladder(None)).run()
    finally:
        slots.close()
    assert side_by_side.chosen.candidate.key() == serial.chosen.candidate.key()
    assert probe_records(side_by_side) == probe_records(serial)  # the walk asked for the same, and got the same
    walked = len(probe_records(serial))
    assert slots.rounds < walked + len([r for r in serial.records if r.kind == "verify"])
    assert any(crowd > 1 for _, _, crowd in runner.crowds)  # probes did run side by side
    assert slots.started == len(runner.crowds) and slots.started > walked  # and some ran ahead, unused
    assert all(crowd == 1 for _, steps, crowd in runner.crowds if steps == 10)  # verifications ran alone
    assert side_by_side.verified.fits and beside(side_by_side.verified) == 0


def test_a_timing_beside_others_is_not_ranked_against_one_alone(tmp_path):
    from autofit.core import Candidate, ProbeResult
    from autofit.search._result import Fit
    from autofit.search._speed_tie import SpeedJudge

    spec = formula_spec(tmp_path, 400 * MiB)
    judge = SpeedJudge(spec, Search(spec, FormulaRunner(400 * MiB), resolve_ladder(None)).guide, [])
    candidate = Candidate(algo="sft", model="tiny-qwen2", device="cuda", micro_batch=2, grad_accum=4, max_length=512)
    alone = Fit(0, candidate, ProbeResult(Outcome.OK, peak_bytes=1, tokens_per_second=1000.0))
    crowded = Fit(1, candidate.replace(checkpointing=True),
                  ProbeResult(Outcome.OK, peak_bytes=1, tokens_per_second=500.0, stats={"beside": 2}))
    assert judge.tied(alone, crowded)  # 2x apart, but not comparable: settled by verifying both alone
    assert not judge.tied(alone, Fit(1, crowded.candidate, ProbeResult(Outcome.OK, peak_bytes=1,
                                                                       tokens_per_second=500.0)))


def test_probe_devices_are_checked_against_the_processes_of_a_candidate(tmp_path):
    def spec(**fields):
        return spec_of(out_dir=Path(tmp_path), model="tiny-qwen2", budget_bytes=100 * MiB, **fields)

    assert probe_slots(spec()) is None
    assert probe_slots(spec(gpus_for_probes=(0, 2))) == ["0", "2"]
    with pytest.raises(InputError, match=r"--gpus-for-probes 3 gives 1 device\(s\).*--gpus 2 runs 2 processes"):
        probe_slots(spec(gpus_for_probes=(3,), ranks=2))


def test_each_probe_sees_only_its_own_devices(tmp_path):
    """Real probe processes, side by side on devices 5, 6 and 7: each is told its own."""
    from autofit.core import Candidate

    slots = SlotRunner(ProcessRunner("probe_factories:names_its_devices", 2**30, tmp_path, timeout_s=120),
                       ["5", "6", "7"])
    base = Candidate(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=1, grad_accum=8, max_length=64)
    first, second = base, base.replace(micro_batch=2, grad_accum=4)
    try:
        slots.ahead(first, [second], steps=2)
        assert len(slots.pending()) == 2 and slots.slots.free == 1  # both started, each on a device of its own
        errors = [slots.run(candidate, 2).error for candidate in (first, second)]
    finally:
        slots.close()
    assert sorted(error.rsplit("devices ", 1)[1] for error in errors) == ["5", "6"]
    threads = max(1, (os.cpu_count() or 1) // 3)  # the host's cores shared among three devices' probes
    assert all(f"threads {threads} devices" in error for error in errors)
    assert slots.rounds == 1 and slots.started == 2 and slots.slots.free == 3


def test_probes_the_walk_no_longer_needs_are_stopped_before_a_verification(tmp_path):
    """Two real probes that hang, started ahead: the verification does not wait for them, it stops them."""
    from autofit.core import Candidate

    slots = SlotRunner(ProcessRunner("probe_factories:hangs", 2**30, tmp_path, timeout_s=300), ["0", "1"])
    base = Candidate(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=1, grad_accum=8, max_length=64)
    try:
        slots.ahead(base, [base.replace(micro_batch=2, grad_accum=4)], steps=2)
        time.sleep(1.0)
        begun = time.monotonic()
        slots.drain()
        assert time.monotonic() - begun < 30 and slots.unused == 2 and slots.slots.free == 2
        pids = [int(p.read_text()) for p in (tmp_path / "probes").rglob("pid") if p.is_file()]
        assert not pids  # each probe's pid file goes with its process
    finally:
        slots.close()


def test_host_memory_is_shared_by_the_probes_running_at_once():
    table = SlotTable(["0", "1", "2"], host_bytes=100)
    first = table.take(1, host=60)
    assert table.take(1, wait=False, host=60) is None  # a second offloading probe would not have its 60 bytes
    second = table.take(1, wait=False, host=40)
    assert second is not None
    table.give(first, host=60)
    table.give(second, host=40)
    assert table.take(1, wait=False, host=150) == ["0"]  # more than the host has: it runs alone, as serially
    assert table.take(1, wait=False, host=1) is None


def test_a_candidate_of_two_processes_takes_two_devices(tmp_path):
    from autofit.core import Candidate

    given = {}
    runner = TimedFormulaRunner(2**30)
    slots = SlotRunner(runner, ["0", "1", "2"], on_devices=lambda devices: given.setdefault(tuple(devices), runner))
    base = Candidate(algo="sft", model="tiny-qwen2", device="cuda", micro_batch=1, grad_accum=8, max_length=64)
    pair, single, other = base.replace(ranks=2), base.replace(micro_batch=2, grad_accum=4), base.replace(micro_batch=4,
                                                                                                        grad_accum=2)
    try:
        slots.ahead(pair, [single, other], steps=2)  # the pair takes 0 and 1, the single 2; no slot is left for other
        assert [plan[0] for plan in slots.pending()] == [pair.key(), single.key()]
        assert all(slots.run(c, 2).outcome is Outcome.OK for c in (pair, single, other))
    finally:
        slots.close()
    assert list(given) == [("0", "1"), ("2",), ("0",)]


def test_the_pruning_passs_levels_are_read_ahead_each_rung_dropped_in_turn(tmp_path):
    from autofit.search._pruning import pruned_levels

    search = Search(formula_spec(tmp_path, 620 * MiB), FormulaRunner(620 * MiB), resolve_ladder(None))
    lora = next(state for state in search.levels if "lora" in state.rungs)
    assert [state.rungs for state in pruned_levels(lora, search.rungs, search.start)] == [
        ("expandable-segments", "micro-batch", "checkpointing", "activation-offload", "bf16-weights", "lora"),
        ("expandable-segments", "micro-batch", "checkpointing", "bf16-weights", "lora"),
        ("expandable-segments", "micro-batch", "bf16-weights", "lora"),  # bf16 weights stay: free under adapters
    ]


def test_indices_are_cudas_under_cuda_visible_devices(tmp_path, monkeypatch):
    """A Slurm allocation sets CUDA_VISIBLE_DEVICES: 0 is its first GPU, and a probe is given the entry, never a GPU
    outside it."""
    def spec(devices):
        return spec_of(out_dir=Path(tmp_path), model="tiny-qwen2", budget_bytes=100 * MiB, device="cuda",
                       gpus_for_probes=devices)

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert probe_slots(spec((0, 3))) == ["4", "7"]
    with pytest.raises(InputError, match=r"names GPU 4, and CUDA_VISIBLE_DEVICES=4,5,6,7 leaves this process 4: "
                                         r"give indices from 0 to 3"):
        probe_slots(spec((1, 4)))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert probe_slots(spec((1, 4))) == ["1", "4"]


def test_a_copy_that_learns_forking_fails_tells_the_runner_it_came_from(tmp_path, monkeypatch):
    from autofit.core import Candidate, ProbeResult
    from autofit.probe._classify import BAD_FORK

    runner = ProcessRunner("sft", None, tmp_path, start_method="forkserver")
    copy = runner.on_devices(["1"])
    answers = iter([ProbeResult(Outcome.CRASH, cause=BAD_FORK, error="forked after CUDA"), ProbeResult(Outcome.OK)])
    monkeypatch.setattr(ProcessRunner, "_run_once", lambda self, candidate, plan: next(answers))
    candidate = Candidate(algo="sft", model="tiny-qwen2", device="cuda", micro_batch=1, grad_accum=8, max_length=64)
    assert copy.run(candidate, 2).outcome is Outcome.OK
    assert copy.start_method == runner.start_method == "spawn"  # the next copies start with spawn, not a bad fork
    assert runner.on_devices(["2"]).start_method == "spawn"


def test_closing_stops_the_walks_own_probe_too(tmp_path):
    """Ctrl-C while the walk waits: the search's end stops its probe instead of waiting for it."""
    from autofit.core import Candidate
    from autofit.probe._runner import ProbeCancelled

    slots = SlotRunner(ProcessRunner("probe_factories:hangs", 2**30, tmp_path, timeout_s=300), ["0"])
    candidate = Candidate(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=1, grad_accum=8, max_length=64)
    raised = []

    def walk():
        try:
            slots.run(candidate, 2)
        except ProbeCancelled as exc:
            raised.append(exc)

    waiting = threading.Thread(target=walk)
    waiting.start()
    time.sleep(1.5)
    begun = time.monotonic()
    slots.close()
    waiting.join(30)
    assert not waiting.is_alive() and raised and time.monotonic() - begun < 30 and slots.slots.free == 1


def test_the_host_share_of_a_candidate_is_the_memory_models_offloaded_bytes(tmp_path):
    from autofit.core import Candidate
    from autofit.search import available_host_bytes, slot_runner

    spec = spec_of(out_dir=Path(tmp_path), model="Qwen/Qwen2.5-0.5B", budget_bytes=8 * 2**30, device="cuda",
                   gpus_for_probes=(0, 1))
    slots = slot_runner(spec, FormulaRunner(8 * 2**30))
    try:
        plain = Candidate(algo="sft", model="Qwen/Qwen2.5-0.5B", device="cuda", micro_batch=1, grad_accum=8,
                          max_length=512)
        assert slots.host_need(plain) == 0
        assert slots.host_need(plain.replace(offload=True)) > 2**30  # fp32 Adam states of 0.5B, off the GPU
        assert slots.slots.host_bytes == pytest.approx(available_host_bytes(), rel=0.2)
    finally:
        slots.close()


def test_on_the_cpu_a_timing_beside_others_does_not_calibrate_the_speed_model(tmp_path, monkeypatch):
    from autofit.core import Candidate, ProbeResult
    from autofit.search import _speed_tie
    from autofit.search._result import Record
    from autofit.search._speed_tie import SpeedJudge

    calibrated_on = []
    monkeypatch.setattr(_speed_tie, "calibrate_speed", lambda points, shape, card: calibrated_on.append(points))
    spec = spec_of(out_dir=Path(tmp_path), model="tiny-qwen2", budget_bytes=100 * MiB)
    search = Search(spec, FormulaRunner(100 * MiB), resolve_ladder(None))
    judge = SpeedJudge(spec, search.guide, [], [])
    monkeypatch.setattr(judge, "card", lambda: object())
    alone = Candidate(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=1, grad_accum=8, max_length=64)
    crowded = alone.replace(micro_batch=2, grad_accum=4)
    for candidate, stats in ((alone, {}), (crowded, {"beside": 1})):
        judge.records.append(Record(0, candidate, "probe", ProbeResult(Outcome.OK, peak_bytes=1, tokens_per_second=99.0,
                                                                       stats=stats), False, None, None))
    judge._calibration([])
    assert [c for c, _ in calibrated_on[0]] == [alone]
