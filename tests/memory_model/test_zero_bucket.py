"""DeepSpeed ZeRO's reduce (ipg) buckets in the ledger, phase by phase, against real DeepSpeed probes on the CPU meter.

ZeRO-1/2 allocate their bucket (two with ``overlap_comm``) at the backward's first gradient and free it at the end
of the backward; ZeRO-3 allocates one with the optimizer and keeps it. The numbers below were measured with
``measure`` below (DeepSpeed 0.19.8, tiny-qwen2, 2 rows x 64 tokens, TRL's defaults; float32 on the CPU, so a
1e8-element bucket is 381.5 MiB): docs/decisions.md "ZeRO's reduce buckets, phase by phase".
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml
from fakes import at_door_values

from autofit.core import SearchOptions
from autofit.memory_model import _engine_settings, base_candidate, phase_ledgers
from autofit.search import estimate_question

MIB = 2**20
BACKWARD_PHASES = ("train", "backward", "first_backward")  # what the probe's forward_backward phase spans


def _config(stage: int, bucket: float, overlap: Any = None, accum: int = 1) -> Dict[str, Any]:
    zero: Dict[str, Any] = {"stage": stage, "reduce_bucket_size": bucket}
    if overlap is not None:
        zero["overlap_comm"] = overlap
    return {"model_name_or_path": "tiny-qwen2", "max_length": 64, "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": accum,
            "deepspeed": {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
                          "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
                          "zero_force_ds_cpu_optimizer": False}}


# case: (the user's file, measured MiB: the probe's forward_backward peak, its optimizer_step peak)
MEASURED = {
    "zero2, 1e6": (_config(2, 1e6), 139.62, 86.54),
    "zero2, 1e8": (_config(2, 1e8), 489.64, 86.54),
    "zero2, 1e8, overlap_comm": (_config(2, 1e8, overlap=True), 871.11, 86.54),
    "zero2, 1e8, accumulation 2": (_config(2, 1e8, accum=2), 511.28, 86.54),
    "zero1, 1e8, accumulation 2": (_config(1, 1e8, accum=2), 542.73, 86.54),
    "zero3, 1e6": (_config(3, 1e6), 165.07, 111.99),
    "zero3, 1e8": (_config(3, 1e8), 542.72, 489.64),
}


def _candidate(folder: Path, config: Dict[str, Any]):
    """The run of a file as `autofit estimate --config` reads it (TRL's parser: about 10 s)."""
    path = folder / "ds.yaml"
    path.write_text(yaml.safe_dump(config))
    values = at_door_values({"config": str(path), "device": "cpu", "gpu_memory": "4GiB"})
    return base_candidate(estimate_question(SearchOptions(**values)))


@pytest.fixture(scope="module")
def read(tmp_path_factory):
    """A file read once; the other cases differ from it only in its DeepSpeed block and accumulation."""
    base = _candidate(tmp_path_factory.mktemp("zero"), _config(2, 1e6))

    def variant(config: Dict[str, Any]):
        return base.replace(user_args=(("deepspeed", config["deepspeed"]),),
                            grad_accum=config["gradient_accumulation_steps"])
    return variant


def test_a_variant_is_the_file_as_read(read, tmp_path):
    config = _config(3, 1e8, overlap=True, accum=2)
    assert read(config) == _candidate(tmp_path, config)


def _phases(candidate) -> Dict[str, float]:
    return {ledger.phase: ledger.total / MIB for ledger in phase_ledgers(candidate)}


@pytest.fixture(autouse=True)
def current_deepspeed(monkeypatch):
    """The measurements' DeepSpeed: its buckets allocated at the first gradient (whatever is installed here)."""
    monkeypatch.setattr(_engine_settings, "version", lambda name: "0.19.8")


@pytest.mark.parametrize("case", list(MEASURED))
def test_the_predicted_peak_is_the_measured_one_within_two_percent(read, case):
    config, forward_backward, step = MEASURED[case]
    phases = _phases(read(config))
    measured = max(forward_backward, step)
    assert abs(max(phases.values()) - measured) < 0.02 * measured, (phases, measured)
    assert abs(max(phases[p] for p in BACKWARD_PHASES) - forward_backward) < 0.02 * forward_backward, phases


def test_the_bucket_lives_where_deepspeed_holds_it(read):
    bucket = (1e8 - 1e6) * 4 / MIB  # float32 on the CPU: 377.66 MiB more at 1e8 elements than at 1e6
    small, large = (_phases(read(_config(2, size))) for size in (1e6, 1e8))
    assert large["step"] == pytest.approx(small["step"])  # freed at the end of the backward: not at the step
    assert large["train"] == pytest.approx(small["train"])  # allocated after the LM head's backward
    assert large["backward"] - small["backward"] == pytest.approx(bucket)
    assert MEASURED["zero2, 1e8"][2] == MEASURED["zero2, 1e6"][2]  # as measured at the optimizer step
    two = _phases(read(_config(2, 1e8, overlap=True)))
    assert two["backward"] - large["backward"] == pytest.approx(1e8 * 4 / MIB)  # overlap_comm's second one
    small3, large3 = (_phases(read(_config(3, size))) for size in (1e6, 1e8))
    for phase in ("train", "backward", "step"):  # ZeRO-3: one bucket, from the engine's setup on
        assert large3[phase] - small3[phase] == pytest.approx(bucket)
    assert MEASURED["zero3, 1e8"][2] - MEASURED["zero3, 1e6"][2] == pytest.approx(bucket, abs=0.05)
    overlapped = _phases(read(_config(3, 1e8, overlap=True)))
    assert overlapped["train"] == pytest.approx(large3["train"])  # overlap_comm adds none under ZeRO-3


def test_before_deepspeed_0_17_2_the_bucket_sits_beside_the_lm_heads_backward(read, monkeypatch):
    candidate = read(_config(2, 1e8))
    current = _phases(candidate)
    monkeypatch.setattr(_engine_settings, "version", lambda name: "0.17.1")
    older = _phases(candidate)
    assert older["train"] - current["train"] == pytest.approx((1e8 * 4) / MIB)  # allocated in backward()
    assert older["step"] == pytest.approx(current["step"])  # freed at the end of the backward all the same


@pytest.mark.parametrize(("installed", "before"), [("0.16.9", True), ("0.17.1", True), ("0.17.2", False),
                                                    ("0.19.8", False), ("0.20.0+cu124", False)])
def test_the_installed_deepspeed_decides_when_the_buckets_are_allocated(monkeypatch, installed, before):
    monkeypatch.setattr(_engine_settings, "version", lambda name: installed)
    assert _engine_settings.buckets_before_backward() is before


def test_without_deepspeed_the_current_releases_are_modelled(monkeypatch):
    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(_engine_settings, "version", missing)
    assert _engine_settings.buckets_before_backward() is False


def measure(names=None) -> Dict[str, Dict[str, float]]:
    """The MEASURED numbers, again: one real DeepSpeed probe per case (about 90 s each on two cores)."""
    import tempfile

    from autofit.probe import ProcessRunner, prepare_factory

    work = Path(tempfile.mkdtemp(prefix="zero-bucket-"))
    runner = ProcessRunner(prepare_factory("sft"), None, work, timeout_s=600)
    found = {}
    for name in names or MEASURED:
        result = runner.run(_candidate(work, MEASURED[name][0]), 2)
        assert result.outcome.name == "OK", result.error
        found[name] = {phase: peak / MIB for phase, peak in result.phase_peaks.items()}
    return found


@pytest.mark.slow
def test_a_live_probe_with_overlap_comms_two_buckets_measures_what_is_recorded():
    case = "zero2, 1e8, overlap_comm"
    peaks = measure([case])[case]
    _, forward_backward, step = MEASURED[case]
    assert peaks["forward_backward"] == pytest.approx(forward_backward, rel=0.01)
    assert peaks["optimizer_step"] == pytest.approx(step, rel=0.01)
