"""Several GPUs (``--gpus N``): probes of several ranks (real data-parallel TRL training on the CPU, gloo, a simulated
device per rank), the peak over ranks, a rank's out-of-memory error, a hung rank, the effective batch over ranks,
the sharding rungs, their accelerate and DeepSpeed files as accelerate's launch code reads them, the per-GPU ledger,
the export and the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from autofit import memory_model as mm
from autofit.core import Candidate, InputError, Outcome, SearchSpec
from autofit.export import write as export_write
from autofit.probe import ProcessRunner
from autofit.probe._ranks import combine
from autofit.rungs import DEFAULT_LADDER, SHARDING_RUNGS, LadderState, OptimizerOffload, climb, resolve_ladder
from autofit.rungs.engines import (
    ACCELERATE_YAML,
    DEEPSPEED_JSON,
    ENGINES,
    ZERO_STAGES,
    launch_env,
    write_engine_files,
)
from autofit.search import Search

try:
    from fakes import FormulaRunner, MiB, formula_spec
    from probe_factories import RANK_ONE_BALLAST_MIB
except ImportError:  # tests/ became a package
    from tests.fakes import FormulaRunner, MiB, formula_spec
    from tests.probe_factories import RANK_ONE_BALLAST_MIB

FACTORIES = "probe_factories" if "probe_factories" in sys.modules else "tests.probe_factories"


def two_ranks(**changes) -> Candidate:
    fields = dict(algo="sft", model="tiny-qwen2", device="cpu", micro_batch=1, grad_accum=1, max_length=64, ranks=2)
    fields.update(changes)
    return Candidate(**fields)


def _probe_processes():
    """Probe processes still alive: forked from the forkserver (a grandchild of this process), or started directly
    (a child that is neither the forkserver nor multiprocessing's resource tracker)."""
    alive = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            direct = process.ppid() == os.getpid()
            command = " ".join(process.cmdline())
        except psutil.NoSuchProcess:
            continue
        if not direct or ("forkserver" not in command and "resource_tracker" not in command):
            alive.append(process)
    return alive


# -- real ranks on the CPU (data parallel through accelerate, gloo) -----------------------------------------------
@pytest.fixture(scope="module")
def two_ranks_measured(tmp_path_factory):
    """A probe of two ranks, rank 1 holding 16 MiB more, and its folder."""
    folder = tmp_path_factory.mktemp("two-ranks")
    runner = ProcessRunner(f"{FACTORIES}:rank_one_holds_more", None, folder, timeout_s=300)
    return runner.run(two_ranks(), steps=2), folder


@pytest.mark.slow
@pytest.mark.floor
def test_two_ranks_train_together_and_the_peak_is_the_largest_ranks(two_ranks_measured):
    result, folder = two_ranks_measured
    assert result.outcome is Outcome.OK, result.error
    rank0, rank1 = result.stats["rank_peak_bytes"]
    assert rank1 - rank0 == pytest.approx(RANK_ONE_BALLAST_MIB * MiB, rel=0.02)
    assert result.peak_bytes == rank1
    assert result.tokens_per_second > 0 and result.steps == 2
    # each rank ran under the accelerate config the export writes: two processes of data parallel
    [probe] = (folder / "probes").iterdir()
    assert "num_processes: 2" in (probe / "trainer" / "engine" / ACCELERATE_YAML).read_text()


@pytest.mark.slow
def test_an_oom_on_one_rank_is_the_candidates_and_the_other_rank_is_ended(tmp_path, two_ranks_measured):
    peaks = two_ranks_measured[0].stats["rank_peak_bytes"]
    budget = (peaks[0] + peaks[1]) // 2  # rank 0 fits, rank 1 (16 MiB more) does not
    runner = ProcessRunner(f"{FACTORIES}:rank_one_holds_more", budget, tmp_path, timeout_s=300)
    result = runner.run(two_ranks(), steps=2)
    assert result.outcome is Outcome.OOM and result.error.startswith("rank 1: ")
    assert not _probe_processes()


@pytest.mark.slow
def test_fsdp2_shards_the_training_state_over_the_ranks_on_the_cpu(tmp_path):
    """FSDP2 full shard for real under gloo (autofit.rungs.engines._probe_fsdp): between steps each rank holds half the
    weights and AdamW states, where data parallel holds all of them and its gradient buckets."""
    runs = {sharding: ProcessRunner("autofit.probe.algos.sft:build_trainer", None, tmp_path / sharding, timeout_s=300)
            .run(two_ranks(sharding=None if sharding == "ddp" else sharding), steps=2) for sharding in ("ddp", "fsdp2")}
    assert all(result.outcome is Outcome.OK and result.steps == 2 for result in runs.values())
    ddp, fsdp2 = (runs[sharding].phase_peaks["between_steps"] for sharding in ("ddp", "fsdp2"))
    assert fsdp2 == pytest.approx(ddp * 3 / 8, rel=0.02)  # (w + 2 states) / 2 against w + 2 states + buckets
    assert max(runs["fsdp2"].stats["rank_peak_bytes"]) < min(runs["ddp"].stats["rank_peak_bytes"])
    # under accumulation the gradients wait unsharded (accelerate's no_sync): the ledger counts them whole
    accumulating = two_ranks(sharding="fsdp2", micro_batch=1, grad_accum=2, max_length=128)
    result = ProcessRunner("autofit.probe.algos.sft:build_trainer", None, tmp_path / "accumulating", timeout_s=300).run(
        accumulating, steps=2)
    assert result.outcome is Outcome.OK, result.error
    assert mm.predict(accumulating).total == pytest.approx(result.peak_bytes, rel=0.1)


@pytest.mark.slow
def test_a_hung_rank_takes_the_probe_down_at_its_time_limit_with_no_orphans(tmp_path):
    runner = ProcessRunner(f"{FACTORIES}:rank_one_hangs", None, tmp_path, timeout_s=8)
    result = runner.run(two_ranks(), steps=2)
    assert result.outcome is Outcome.TIMEOUT
    assert not _probe_processes()


# -- one result from the ranks' -----------------------------------------------------------------------------------
def _result(outcome, peak, error=""):
    from autofit.core import ProbeResult

    return ProbeResult(outcome, peak_bytes=peak, phase_peaks={"train": peak}, error=error)


def test_combine_takes_the_largest_peak_and_any_ranks_oom():
    ok = combine([_result(Outcome.OK, 5), _result(Outcome.OK, 7)], [False, False])
    assert ok.outcome is Outcome.OK and ok.peak_bytes == 7 and ok.stats["rank_peak_bytes"] == [5, 7]
    oom = combine([_result(Outcome.CRASH, 3, "killed"), _result(Outcome.OOM, 9, "out of memory")], [True, False])
    assert oom.outcome is Outcome.OOM and oom.error == "rank 1: out of memory" and oom.phase_peaks == {"train": 9}
    crash = combine([_result(Outcome.CRASH, 3, "gloo: connection closed"), _result(Outcome.CRASH, 2, "boom")],
                    [True, False])
    assert crash.error == "rank 1: boom"  # the rank killed for another's failure does not speak for the candidate


# -- the search over ranks ----------------------------------------------------------------------------------------
def spec(out_dir, budget, **changes) -> SearchSpec:
    return formula_spec(out_dir, budget, **{"ranks": 2, **changes})


def test_the_effective_batch_is_kept_over_the_ranks(tmp_path):
    runner = FormulaRunner(800 * MiB)
    report = Search(spec(tmp_path, 800 * MiB), runner, resolve_ladder(["micro-batch"])).run()
    assert runner.candidates and all(c.ranks == 2 and c.micro_batch * c.grad_accum == 4 for c in runner.candidates)
    assert report.chosen.candidate.effective_batch == 8


def test_a_search_over_ranks_resumes_and_a_new_rank_count_does_not(tmp_path):
    first = Search(spec(tmp_path, 800 * MiB), FormulaRunner(800 * MiB), resolve_ladder(["micro-batch"])).run()
    again_runner = FormulaRunner(800 * MiB)
    again = Search(spec(tmp_path, 800 * MiB), again_runner, resolve_ladder(["micro-batch"])).run()
    assert first.probes_run > 0 and again.probes_run == 0 and not again_runner.probes(steps=2)
    assert again.chosen.candidate.key() == first.chosen.candidate.key()
    four = FormulaRunner(800 * MiB)
    Search(spec(tmp_path, 800 * MiB, ranks=4), four, resolve_ladder(["micro-batch"])).run()
    assert four.probes(steps=2) and all(c.ranks == 4 for c in four.candidates)


def test_bad_rank_counts_are_named(tmp_path):
    with pytest.raises(InputError, match="--effective-batch 6 cannot be split evenly over --gpus 4"):
        spec(tmp_path, 10**9, effective_batch=6, ranks=4)
    with pytest.raises(InputError, match="--gpus 0 is not valid"):
        spec(tmp_path, 10**9, ranks=0)
    assert spec(tmp_path, 10**9).study_name() != spec(tmp_path, 10**9, ranks=1).study_name()  # resume per rank count


def test_sharding_rungs_apply_only_across_several_gpus():
    rungs = resolve_ladder(["micro-batch", *SHARDING_RUNGS])
    one = climb(LadderState(two_ranks(device="cuda", ranks=1, micro_batch=2)), rungs)
    assert [level.rungs for level in one] == [(), ("micro-batch",)]
    levels = climb(LadderState(two_ranks(device="cuda", ranks=4, micro_batch=2)), rungs)
    assert [level.candidate.sharding for level in levels] == [None, None, *SHARDING_RUNGS]
    assert levels[-1].rungs == ("micro-batch", "zero3-offload")  # a sharding replaces the one before it
    assert all(level.cost == "speed" for level in levels[1:])


def test_on_the_cpu_only_data_parallel_runs_and_the_notes_say_why(tmp_path):
    report = Search(spec(tmp_path, 800 * MiB, device="cpu"), FormulaRunner(800 * MiB), list(DEFAULT_LADDER)).run()
    assert any(note.startswith("rungs zero1, zero2, zero3, fsdp2-offload, zero3-offload left out: accelerate "
                               "runs DeepSpeed and FSDP's offload")
               for note in report.notes)
    one_gpu = Search(spec(tmp_path / "one", 800 * MiB, device="cpu", ranks=1), FormulaRunner(800 * MiB),
                     list(DEFAULT_LADDER)).run()
    assert not any("zero1" in note for note in one_gpu.notes)  # nothing to say where sharding cannot apply


# -- the engines' files, as accelerate's launch code reads them -----------------------------------------------------
@pytest.mark.parametrize("engine", [e for e in ENGINES if e != "zero2-offload"])
def test_engine_files_for_several_gpus_are_what_accelerate_launch_reads(tmp_path, engine):
    files = write_engine_files(tmp_path, engine, "cuda", ranks=4)
    text = (tmp_path / ACCELERATE_YAML).read_text()
    assert "num_processes: 4" in text
    env = launch_env(files["accelerate"], "cuda", engine)
    if engine.startswith("zero"):
        zero = json.loads((tmp_path / DEEPSPEED_JSON).read_text())["zero_optimization"]
        assert zero["stage"] == ZERO_STAGES[engine] and env["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert ("offload_param" in zero) == (engine == "zero3-offload")
    elif engine.startswith("fsdp2"):
        assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
        assert env.get("FSDP_OFFLOAD_PARAMS", "false") == ("true" if engine == "fsdp2-offload" else "false")
        assert not (tmp_path / DEEPSPEED_JSON).exists()
    else:
        assert "distributed_type: MULTI_GPU" in text and "ACCELERATE_USE_DEEPSPEED" not in env


# -- the per-GPU ledger ---------------------------------------------------------------------------------------------
def test_each_sharding_holds_less_per_gpu_for_a_full_fine_tune():
    base = Candidate(algo="sft", model="Qwen/Qwen2.5-7B", device="cuda", micro_batch=1, grad_accum=1,
                     max_length=1024, checkpointing=True, ranks=4)
    peak = {s: mm.predict(base.replace(sharding=s)).total for s in (None, *SHARDING_RUNGS)}
    assert peak[None] > peak["zero1"] > peak["zero2"] > peak["zero3"] > peak["zero3-offload"]
    assert peak["fsdp2"] < peak["zero2"] and peak["fsdp2-offload"] < peak["fsdp2"]
    shape = mm.ModelShape.from_model("Qwen/Qwen2.5-7B")
    host = {s: mm.host_bytes(base.replace(sharding=s), shape, "cuda") for s in SHARDING_RUNGS}
    assert all(host[s] == 0 for s in ("zero1", "zero2", "fsdp2", "zero3"))
    total = mm.param_counts(shape).total  # the machine's host RAM: every rank's shards
    assert host["zero3-offload"] == total * (2 + 16) and host["fsdp2-offload"] == total * 4 * 4  # w, g, 2 states
    one = mm.predict(base.replace(ranks=1)).total
    assert peak[None] > one  # data parallel: every rank holds it all, and DDP's buckets copy the gradients


def _phases(candidate):
    return {ledger.phase: ledger for ledger in mm.phase_ledgers(candidate, device="cuda")}


def _deepspeed(**zero):
    return (("deepspeed", {"zero_optimization": {"stage": 2, **zero}, "bf16": {"enabled": True}}),)


def test_zero_holds_its_gradient_buffers_from_the_backward_as_its_configuration_sizes_them():
    shape = mm.ModelShape.from_model("Qwen/Qwen2.5-7B")
    own = Candidate(algo="sft", model="Qwen/Qwen2.5-7B", device="cuda", micro_batch=1, grad_accum=1, max_length=128,
                    checkpointing=True, user_args=_deepspeed(reduce_bucket_size=5e8))
    trainable = sum(t.numel * t.count for t in mm.trainable_tensors(shape, own))
    phases = _phases(own)  # a ZeRO-2 config of the user's own on one GPU: the Trainer runs it at world size 1
    assert phases["backward"].gradients == trainable * 2 + 5e8 * 2  # the bf16 partition and DeepSpeed's bucket
    assert phases["step"].gradients == trainable * 2 + trainable * 4  # the step's fp32 partition; the bucket is freed
    #                                                                   at the end of the backward
    assert mm.unmodelled(own) == []
    auto = _phases(own.replace(user_args=_deepspeed(reduce_bucket_size="auto", overlap_comm=True)))["backward"]
    assert auto.gradients == trainable * 2 + 2 * shape.hidden ** 2 * 2  # the Trainer's "auto": two with overlap_comm
    plain = _phases(own.replace(user_args=()))["backward"]
    assert plain.gradients == 0  # plain TRL frees the gradients at the step, and holds none before the backward
    offloading = own.replace(user_args=_deepspeed(offload_optimizer={"device": "cpu"}))
    assert mm.unmodelled(offloading) == []  # the optimizer-offload engine (test_launch_engine.py)
    assert mm.unmodelled(own.replace(user_args=_deepspeed(offload_optimizer={"device": "nvme"}))) == [
        "a DeepSpeed config of your own that offloads (its host buffers are not modelled)"]
    assert mm.unmodelled(own.replace(offload="zero2-offload")) == [
        "a DeepSpeed config of your own beside another engine of your launch's (zero2-offload)"]
    replaced = climb(LadderState(own), [OptimizerOffload()])[-1].candidate  # the rung's engine takes the user's place
    assert replaced.offload == "zero2-offload" and replaced.replaces and mm.unmodelled(replaced) == []


def test_zero3_gathers_at_most_its_live_parameters_and_nccl_shows_beside_pytorch():
    base = Candidate(algo="sft", model="Qwen/Qwen2.5-7B", device="cuda", micro_batch=1, grad_accum=1, max_length=128,
                     checkpointing=True, ranks=4, sharding="zero3")
    capped = base.replace(sharding=None, user_args=(("deepspeed", {"zero_optimization": {
        "stage": 3, "stage3_max_live_parameters": 1, "stage3_prefetch_bucket_size": "auto"}}),))
    assert _phases(capped)["backward"].weights < _phases(base)["backward"].weights  # no layer prefetched
    context = mm.predict(base.replace(ranks=1, sharding=None)).cuda_context
    assert mm.predict(base).cuda_context == context + 1e9  # NCCL's buffers: in nvidia-smi, not in PyTorch's peak
    assert mm.predict(base).allocated == mm.predict(base).total - mm.predict(base).allocator - context - 1e9
    assert mm.predict(base.replace(device="cpu"), device="cpu").cuda_context == 0


def test_estimate_shows_the_per_gpu_ledger_of_each_strategy():
    out = subprocess.run([sys.executable, "-m", "autofit.cli", "estimate", "--model", "Qwen/Qwen2.5-7B", "--algo",
                          "grpo", "--gpus", "4", "--gpu-memory", "24GB"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for rung in SHARDING_RUNGS:
        assert f"+{rung}" in out.stdout


def test_export_writes_the_launch_for_several_gpus(tmp_path):
    report = Search(spec(tmp_path, 800 * MiB), FormulaRunner(800 * MiB), resolve_ladder(["micro-batch"])).run()
    export_write(report, tmp_path)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["engine"]["name"] == "ddp" and best["engine"]["ranks"] == 2
    assert best["engine"]["launch"].endswith(f"--accelerate_config {tmp_path.resolve() / ACCELERATE_YAML}")
    assert "num_processes: 2" in (tmp_path / ACCELERATE_YAML).read_text()
    assert "# 2 GPUs (ddp, accelerate.yaml): the batch size and accumulation are per GPU" in \
        (tmp_path / "best.yaml").read_text()


@pytest.mark.parametrize("value, message", [("0", "'0' is not valid"), ("two", "'two' is not valid"),
                                            ("all", "--gpus all: the simulated device has no GPUs to count")])
def test_bad_gpus_on_the_command_line(tmp_path, value, message):
    out = subprocess.run([sys.executable, "-m", "autofit.cli", "search", "--model", "tiny-qwen2", "--device", "cpu",
                          "--gpu-memory", "100MiB", "--gpus", value, "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr


# -- several machines: export only ----------------------------------------------------------------------------------
def test_several_machines_are_exported_with_the_ledger_at_their_world_size(tmp_path):
    two_by_two = spec(tmp_path, 800 * MiB, nodes=2)
    runner = FormulaRunner(800 * MiB)
    report = Search(two_by_two, runner, resolve_ladder(["micro-batch"])).run()
    assert all(c.ranks == 2 and c.micro_batch * c.grad_accum == 2 for c in runner.candidates)  # 8 over 2 x 2
    export_write(report, tmp_path)
    text = (tmp_path / ACCELERATE_YAML).read_text()
    assert "num_machines: 2" in text and "num_processes: 4" in text and "main_process_ip: MAIN_NODE_IP" in text
    launch_env(tmp_path / ACCELERATE_YAML, "cuda", "ddp")  # accelerate's launch code takes it
    engine = json.loads((tmp_path / "best.json").read_text())["engine"]
    assert engine["world_size"] == 4 and engine["peak_bytes_predicted_at_world_size"] > 0
    best_yaml = (tmp_path / "best.yaml").read_text()
    assert "# 2 GPUs x 2 machines (ddp, accelerate.yaml)" in best_yaml and "at world size 4" in best_yaml
    with pytest.raises(InputError, match="cannot be split evenly over --gpus 2 x --nodes 2: use a multiple of 4"):
        spec(tmp_path, 800 * MiB, nodes=2, effective_batch=6)


def test_estimate_for_several_machines_is_at_their_world_size():
    out = subprocess.run([sys.executable, "-m", "autofit.cli", "estimate", "--model", "Qwen/Qwen2.5-7B", "--gpus", "4",
                          "--nodes", "2", "--gpu-memory", "80GB"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "effective batch 8 over 8 GPUs" in out.stdout.splitlines()[0]


def test_each_rank_watches_its_own_gpu_for_other_processes(monkeypatch):
    from autofit.machine._others import _nvml_index

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert _nvml_index() == 3  # the search process: the first visible GPU
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert _nvml_index() == 5
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _nvml_index() == 1


def test_a_rank_left_running_by_an_earlier_search_is_killed(tmp_path):
    from autofit.machine._outdir import PID_FILE, kill_orphan_probes, process_start_ticks

    folder = tmp_path / "probes" / "abc-2" / "rank1"
    folder.mkdir(parents=True)
    with open(folder / "probe.log", "a") as log:  # what marks a probe of this folder: its output goes to the rank's log
        stray = subprocess.Popen(["sleep", "60"], stdout=log, stderr=log)
    (folder / PID_FILE).write_text(json.dumps({"pid": stray.pid, "start": process_start_ticks(stray.pid)}))
    notes = kill_orphan_probes(tmp_path)
    assert stray.wait(timeout=10) == -9 and notes and f"pid {stray.pid}" in notes[0]


def test_every_gpu_of_the_search_must_be_free(tmp_path, monkeypatch):
    from autofit.core import SearchOptions
    from autofit.search import _question

    free = {0: 80 * 2**30, 1: 10 * 2**30}  # another process holds most of the second GPU
    monkeypatch.setattr(_question, "free_bytes", lambda device, budget, rank=None: free[rank or 0])
    monkeypatch.setattr(_question, "other_processes", lambda device, rank=None: [])
    busy = SearchOptions(model="tiny-qwen2", gpus=2)
    with pytest.raises(InputError, match=r"the device has 10.00 GiB free, less than the budget 40.00 GiB: .*\(GPU 1 of "
                                         r"the search's 2\)"):
        _question.busy_budget(busy, "cuda", 40 * 2**30, 2)
    allowed = SearchOptions(model="tiny-qwen2", gpus=2, allow_busy_gpu=True)
    budget, notes = _question.busy_budget(allowed, "cuda", 40 * 2**30, 2)
    assert budget == 10 * 2**30 and notes and "instead of 40.00 GiB" in notes[0]
