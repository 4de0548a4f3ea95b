"""vLLM's whole accounting of its colocated share (issue 59): the GPU-side terms the CPU build has none of (CUDA graphs
for TRL's capture sizes, non-torch memory) from vLLM's own published log lines, the KV cache as what the share
leaves, what vLLM spends beyond its share held in every level's peak, the seed's 4 x 24 GB case through the CLI as a
user types it, and a GRPO file's own ``vllm_max_model_length``."""

from __future__ import annotations

import re

import pytest
from fakes import estimate_cli

from autofit import memory_model as mm
from autofit.core import Candidate, format_size
from autofit.memory_model import (
    VLLM_RECORDS,
    VLLM_UNMODELLED_BAND,
    VllmMeasured,
    capture_sizes,
    equivalent_utilization,
    graph_counts,
    parse_vllm_log,
    vllm_share,
)
from autofit.memory_model._vllm_recorded import GRAPH_BYTES_PER_CAPTURE, NON_TORCH_BYTES

GIB = 2**30


def _size(text: str) -> float:
    """'1.71 GiB' / '409.16 MiB' -> bytes (format_size's units)."""
    number, unit = text.split()
    return float(number) * {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}[unit]


# -- the terms, from vLLM's source and its own log lines ---------------------------------------------------------
def test_capture_sizes_are_vllms_for_trls_max_num_seqs():
    """vLLM's default capture list up to min(2 x max_num_seqs, 512), and FULL_AND_PIECEWISE's graph counts, as its
    own log prints them ("PIECEWISE=51 (largest=512), FULL=35 (largest=256)" at 256 sequences)."""
    assert capture_sizes(1) == [1, 2]
    assert capture_sizes(2) == [1, 2, 4]
    assert capture_sizes(8) == [1, 2, 4, 8, 16]
    many = capture_sizes(256)
    assert many[:5] == [1, 2, 4, 8, 16] and many[-1] == 512 and 248 in many and 264 not in many and 272 in many
    record = next(record for record in VLLM_RECORDS if "FULL=35" in record.log)
    assert graph_counts(256) == (51, 35) and sum(graph_counts(256)) == record.figures["graphs"]
    assert max(capture_sizes(4096)) == 512  # the cap, not 2 x max_num_seqs


def test_the_log_lines_are_read_as_vllm_writes_them():
    log = ("(Worker_TP0 pid=1) INFO [gpu_model_runner.py:4879] Model loading took 12.66 GiB memory and 31.6 seconds\n"
           "INFO [gpu_model_runner.py:6483] Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35 "
           "(largest=256)\nINFO [gpu_model_runner.py:6588] Estimated CUDA graph memory: 1.62 GiB total\n"
           "INFO [gpu_worker.py:508] Available KV cache memory: 37.99 GiB\n"
           "INFO [gpu_model_runner.py] Graph capturing finished in 1 secs, took 0.46 GiB\n"
           "INFO [gpu_worker.py] CUDA graph pool memory: -0.19 GiB (actual), 2.43 GiB (estimated), difference: 2.62\n")
    figures = parse_vllm_log(log)
    assert figures == {"weights": 12.66, "graphs": 86.0, "graphs_estimated": 1.62, "kv_cache": 37.99,
                       "graphs_captured": 0.46, "graphs_actual": -0.19}


def test_the_recorded_constants_cover_every_record():
    """The ledger's non-torch memory and graph memory per capture are the most any record shows: for each record's
    own graph count the ledger's graphs are at least vLLM's estimate there."""
    assert 0.25 * GIB < NON_TORCH_BYTES <= 0.5 * GIB  # a few hundred MiB, as every record says
    for record in VLLM_RECORDS:
        figures = record.figures
        assert figures, f"{record.source}: no line of it is read"
        if "non_torch" in figures:
            assert NON_TORCH_BYTES >= figures["non_torch"] * GIB
        if "graphs" in figures and "graphs_estimated" in figures:
            assert figures["graphs"] * GRAPH_BYTES_PER_CAPTURE >= figures["graphs_estimated"] * GIB * (1 - 1e-9)


@pytest.mark.parametrize("record", [record for record in VLLM_RECORDS if "requested" in record.figures],
                         ids=lambda record: record.source)
def test_the_ledger_given_vllms_own_terms_gives_its_kv_cache(record):
    """Given a record's own terms (weights, activation peak, non-torch memory; those versions captured graphs after
    the cache was sized), the ledger's share at the record's total and utilization leaves the KV cache vLLM logged."""
    figures = record.figures
    shape = mm.ModelShape.from_model("Qwen/Qwen2.5-7B")  # the shape only sizes the tokens; the terms are given
    share = vllm_share(shape, int(figures["total"] * GIB), figures["utilization"], max_num_seqs=8,
                       sequence_tokens=1024, measured=VllmMeasured(
                           weights=figures["weights"] * GIB, profile_peak=figures["activation_peak"] * GIB,
                           non_torch=figures["non_torch"] * GIB, cuda_graphs=0.0))
    assert share.share == pytest.approx(figures["requested"] * GIB, abs=0.01 * GIB)  # the log rounds the total
    assert share.kv_cache == pytest.approx(figures["kv_cache"] * GIB, abs=0.015 * GIB)


@pytest.mark.parametrize("record", [record for record in VLLM_RECORDS if "equivalent_utilization" in record.figures],
                         ids=lambda record: record.source)
def test_the_graph_estimate_comes_out_of_the_share_as_vllm_logs_it(record):
    """vLLM's "the current --gpu-memory-utilization=U is equivalent to E without CUDA graph memory profiling": the
    graphs are a part of the share; the card the line implies is a real card's total (16 to 192 GB)."""
    figures = record.figures
    total = figures["graphs_estimated"] * GIB / (figures["utilization"] - figures["equivalent_utilization"])
    assert 14 * GIB < total < 192 * GIB
    assert equivalent_utilization(figures["utilization"], figures["graphs_estimated"] * GIB, total) == \
        pytest.approx(figures["equivalent_utilization"], abs=1e-4)


def test_the_kv_cache_is_what_the_whole_accounting_leaves():
    shape = mm.ModelShape.from_model("Qwen/Qwen2.5-0.5B")
    share = vllm_share(shape, 24 * GIB, 0.3, max_num_seqs=2, sequence_tokens=640)
    assert share.non_torch == NON_TORCH_BYTES
    assert share.graphs == (3, 2) and share.cuda_graphs == 5 * GRAPH_BYTES_PER_CAPTURE
    assert share.kv_cache == pytest.approx(share.share - share.weights - share.profile_peak - share.non_torch
                                           - share.cuda_graphs)
    wider = vllm_share(shape, 24 * GIB, 0.3, max_num_seqs=64, sequence_tokens=640)
    assert sum(wider.graphs) > sum(share.graphs) and wider.kv_cache < share.kv_cache  # more sequences, more graphs


def test_what_vllm_needs_counts_its_graphs_and_non_torch_memory():
    candidate = Candidate(algo="grpo", model="Qwen/Qwen2.5-7B", device="cuda", micro_batch=2, grad_accum=1,
                          max_length=512, prompt_length=128, ranks=4, vllm="colocate", vllm_utilization=0.7,
                          vllm_share_bytes=int(0.7 * 24 * GIB), vllm_max_model_length=640)
    shape = mm.ModelShape.from_model("Qwen/Qwen2.5-7B")
    share = mm.candidate_share(candidate, shape)
    cache = max(share.start_tokens, share.batch_tokens) * share.kv_per_token
    assert mm.vllm_need(candidate, shape) == pytest.approx(share.weights + share.profile_peak + share.non_torch
                                                           + share.cuda_graphs + cache)
    # TRL's max_num_seqs: per-device batch x tensor parallel x steps per generation
    steps = candidate.replace(user_args=(("steps_per_generation", 4),))
    assert mm.candidate_share(steps, shape).max_num_seqs == 8


def test_a_share_that_leaves_less_than_the_unmodelled_band_is_not_a_fit():
    """What vLLM spends beyond its share is held at the band's high end in every phase: a card that has the trainer
    and the share but less than that beside them is not called a fit."""
    shape = mm.ModelShape.from_model("Qwen/Qwen2.5-0.5B")
    candidate = Candidate(algo="grpo", model="Qwen/Qwen2.5-0.5B", device="cuda", micro_batch=2, grad_accum=1,
                          max_length=512, prompt_length=128, vllm="colocate", vllm_utilization=0.3,
                          vllm_share_bytes=int(0.3 * 24 * GIB), vllm_max_model_length=640)
    assert mm.vllm_term(candidate, shape) == pytest.approx(int(0.3 * 24 * GIB) + VLLM_UNMODELLED_BAND[1])
    ledger = max(mm.phase_ledgers(candidate, shape), key=lambda ledger: ledger.total)
    without_band = ledger.total - VLLM_UNMODELLED_BAND[1] * ledger.reserved_factor
    leaves_too_little = (without_band + ledger.total) / 2  # the trainer and the share fit, the band does not
    assert without_band < leaves_too_little and not ledger.fits(leaves_too_little)
    assert ledger.fits(ledger.total)


# -- through the CLI, as a user types it -------------------------------------------------------------------------
SEED = ("--model", "Qwen/Qwen2.5-7B", "--algo", "grpo", "--use-vllm", "colocate", "--gpus", "4", "--gpu-memory",
        "RTX3090")


def test_the_seed_case_refuses_trls_default_and_proposes_a_share_with_room_for_vllms_overheads():
    """4 x RTX 3090, TRL's defaults: vLLM does not start at 0.3; the level the estimate expects gives vLLM a share
    that holds its weights, profiling peak, non-torch memory, CUDA graphs and the batch's KV cache, and the card keeps
    what vLLM spends beyond its share (the band) on top: the old answer kept 0.10 GiB of the card."""
    text = estimate_cli(*SEED)
    first = next(line for line in text.splitlines() if line.startswith("vllm: colocate"))
    assert first.startswith("vllm: colocate, 30% of each GPU") and "vLLM will not start" in first
    block = [line for line in text.splitlines() if line.startswith("vllm:   ")]
    assert [line.split()[1] for line in block] == ["weights", "profiling", "non-torch", "CUDA", "KV", "beyond"]
    level = next(line for line in text.splitlines() if line.strip().startswith("vllm at this level:"))
    share = _size(re.search(r"of each GPU \(([\d.]+ \w+)\)", level).group(1))
    terms = {name: _size(value) for name, value in re.findall(
        r"(weights|profiling peak|non-torch|CUDA graphs|KV cache) ([\d.]+ [KMG]?i?B)", level)}
    assert terms["non-torch"] >= NON_TORCH_BYTES * 0.999 and terms["CUDA graphs"] > 0
    assert terms["KV cache"] > 0 and "holds TRL's 2 sequences" in level
    assert sum(terms.values()) == pytest.approx(share, rel=0.002)
    free = _size(re.search(r"the card keeps ([\d.]+ \w+) free", level).group(1))
    assert f"{format_size(VLLM_UNMODELLED_BAND[1])} beyond it held in the peak" in level
    assert free >= 0 and free + VLLM_UNMODELLED_BAND[1] > 0.5 * GIB  # the old answer: 0.10 GiB spare
    expected = next(line for line in text.splitlines() if line.startswith("use, level "))
    assert "vllm-context+vllm-share" in expected and "ctx640" in expected
    assert "+quant-8bit" not in text  # TRL's colocated vLLM refuses an 8-bit base: no level offers one


def test_a_grpo_files_vllm_max_model_length_is_the_context_vllm_must_hold(tmp_path):
    config = tmp_path / "grpo.yaml"
    config.write_text("model_name_or_path: Qwen/Qwen2.5-7B\nuse_vllm: true\nvllm_mode: colocate\n"
                      "vllm_max_model_length: 1536\nper_device_train_batch_size: 2\nnum_generations: 2\n"
                      "max_completion_length: 1024\n")
    text = estimate_cli("--algo", "grpo", "--config", str(config), "--gpu-memory", "80GiB")
    lines = [line for line in text.splitlines() if line.startswith("vllm:")]
    cache = next(line for line in lines if line.startswith("vllm:   KV cache"))
    assert "one max_model_len sequence, 1,536 tokens" in cache
    assert not any("131072" in line or "131,072" in line or "32,768" in line for line in lines)
    small = estimate_cli("--algo", "grpo", "--config", str(config), "--gpu-memory", "RTX3090")
    first = next(line for line in small.splitlines() if line.startswith("vllm: colocate"))
    assert "one 1536-token sequence" in first and "set vllm_max_model_length" not in first  # the file set it


def test_best_json_gives_the_share_term_by_term():
    from types import SimpleNamespace

    from autofit.export._vllm import vllm_data

    candidate = Candidate(algo="grpo", model="Qwen/Qwen2.5-0.5B", device="cuda", micro_batch=2, grad_accum=1,
                          max_length=512, prompt_length=128, vllm="colocate", vllm_utilization=0.3,
                          vllm_share_bytes=int(0.3 * 24 * GIB), vllm_max_model_length=640)
    nothing_measured = SimpleNamespace(stats={})
    report = SimpleNamespace(chosen=SimpleNamespace(result=nothing_measured), verified=nothing_measured)
    predicted = vllm_data(report, candidate, "Qwen/Qwen2.5-0.5B")["predicted"]
    share = mm.candidate_share(candidate, mm.ModelShape.from_model("Qwen/Qwen2.5-0.5B"))
    assert predicted["non_torch_bytes"] == round(NON_TORCH_BYTES)
    assert predicted["cuda_graphs"] == {"piecewise": 3, "full": 2}
    assert predicted["cuda_graphs_bytes"] == round(5 * GRAPH_BYTES_PER_CAPTURE)
    assert predicted["beyond_share_bytes"] == VLLM_UNMODELLED_BAND[1]
    assert sum(predicted[key] for key in ("weights_bytes", "profile_peak_bytes", "non_torch_bytes",
                                          "cuda_graphs_bytes", "kv_cache_bytes")) == pytest.approx(share.share, abs=8)


def test_the_simulated_devices_vllm_has_no_gpu_side_terms():
    """On the CPU meter vLLM is its CPU build: no CUDA graphs, no non-torch memory on a card, nothing beyond its share
    (the probes reserve the share as a block); a tiny model's share under a small budget is not priced out by them."""
    candidate = Candidate(algo="grpo", model="tiny-qwen2", device="cpu", micro_batch=2, grad_accum=1, max_length=16,
                          prompt_length=8, vllm="colocate", vllm_utilization=0.3, vllm_share_bytes=int(0.3 * 2 * GIB),
                          vllm_max_model_length=24)
    shape = mm.ModelShape.from_model("tiny-qwen2")
    share = mm.candidate_share(candidate, shape)
    assert share.non_torch == 0 and share.cuda_graphs == 0 and share.graphs == (0, 0)
    assert mm.vllm_term(candidate, shape) == candidate.vllm_share_bytes
    on_gpu = mm.candidate_share(candidate.replace(device="cuda"), shape)
    assert on_gpu.non_torch == NON_TORCH_BYTES and on_gpu.cuda_graphs > 0
    assert mm.vllm_term(candidate.replace(device="cuda"), shape) == candidate.vllm_share_bytes + VLLM_UNMODELLED_BAND[1]


def test_the_profile_runs_peak_is_vllms_for_a_known_model():
    """vllm#15815: Qwen2.5-32B-Instruct on 2 x L40S (TP 2), vLLM 0.8's V0 engine, max_model_len 10000, so
    max_num_batched_tokens 10000 (V0 without chunked prefill: max(max_model_len, 2048)) and its default 256 sequences:
    "PyTorch activation peak memory takes 1.26GiB". The ledger's profile peak for that run is within 10%."""
    from autofit.memory_model._vllm import profile_peak

    record = next(record for record in VLLM_RECORDS if record.source == "vllm-project/vllm#15815")
    tokens = int(record.figures["max_model_len"])
    assert tokens == 10000
    predicted = profile_peak(mm.ModelShape.from_model("Qwen/Qwen2.5-32B"), tokens, 256, tensor_parallel=2)
    assert predicted == pytest.approx(record.figures["activation_peak"] * GIB, rel=0.10)


def test_a_share_vllm_cannot_start_in_is_no_fit_on_any_card(tmp_path):
    """A share too small for one max_model_len sequence is refused by vLLM at its start, whatever the card has beside
    it: the ledger says why, no budget makes it a fit, and the estimate's answer sizes the share instead."""
    shape = mm.ModelShape.from_model("Qwen/Qwen2.5-0.5B")
    small = Candidate(algo="grpo", model="Qwen/Qwen2.5-0.5B", device="cuda", micro_batch=2, grad_accum=1,
                      max_length=256, prompt_length=128, vllm="colocate", vllm_utilization=0.03,
                      vllm_share_bytes=int(0.03 * 24 * GIB))
    for ledger in mm.phase_ledgers(small, shape):
        assert ledger.refused.startswith("vLLM does not start at 3% of the card") and "32768-token" in ledger.refused
        assert not ledger.fits(10**15) and ledger.verdict(10**15) == "no"
    enough = small.replace(vllm_utilization=0.1, vllm_share_bytes=int(0.1 * 24 * GIB))
    assert all(not ledger.refused and ledger.fits(24 * GIB) for ledger in mm.phase_ledgers(enough, shape))
    assert not any(ledger.refused for ledger in mm.phase_ledgers(small.replace(device="cpu"), shape))  # CPU build
    config = tmp_path / "grpo.yaml"
    config.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_vllm: true\nvllm_mode: colocate\n"
                      "vllm_gpu_memory_utilization: 0.03\nper_device_train_batch_size: 2\nnum_generations: 2\n"
                      "max_completion_length: 256\n")
    text = estimate_cli("--algo", "grpo", "--config", str(config), "--gpu-memory", "24GiB")
    run = next(line for line in text.splitlines() if line.startswith("your run ("))
    assert "does not run: vLLM does not start at 3% of the card" in run
    expected = next(line for line in text.splitlines() if line.startswith("use, level "))
    assert "vllm-share" in expected and "vllm-colocate@0.03" not in expected
