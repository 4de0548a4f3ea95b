"""The classifier (one failure: outcome, fault, cause) and the watch over failures (when the search stops)."""

import errno
import json

import pytest
import torch

from autofit.core import Candidate, FactoryMisuse, Outcome, ProbeResult
from autofit.probe import FactoryError
from autofit.probe._classify import BAD_FORK, classify_exception, classify_exit
from autofit.search import FaultWatch, InfrastructureError, check_no_fit_is_an_answer


def raised(exc):
    """``exc`` with a traceback whose innermost frame is this test module (the user's code)."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def raised_in_library():
    try:
        json.loads("{not json")  # the standard library raises a ValueError
    except ValueError as caught:
        return caught


@pytest.mark.parametrize("exc, stage, user, expected", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "train", False,
     (Outcome.OOM, "", "oom")),
    (RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"), "train", True,
     (Outcome.OOM, "", "oom")),
    (RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
                  "the 'spawn' start method"), "setup", False, (Outcome.CRASH, "infrastructure", BAD_FORK)),
    (OSError(errno.ENOSPC, "No space left on device"), "setup", False, (Outcome.CRASH, "infrastructure", "disk")),
    (RuntimeError("Found no NVIDIA driver on your system."), "setup", False, (Outcome.CRASH, "infrastructure", "cuda")),
    (AssertionError("Torch not compiled with CUDA enabled"), "load", True, (Outcome.CRASH, "infrastructure", "cuda")),
    (ImportError("No module named 'trl'"), "import", False, (Outcome.CRASH, "infrastructure", "import")),
    (ImportError("No module named 'my_trainers'"), "import", True, (Outcome.CRASH, "user", "factory-import")),
    (KeyError("vocab_size"), "setup", False, (Outcome.CRASH, "infrastructure", "setup")),
    # building: a library refusing a combination is the candidate's; the user's own code raising is the user's
    (ValueError("--optim adamw_bnb_8bit requires bitsandbytes"), "load", False, (Outcome.INVALID, "", "rejected")),
    (FactoryMisuse("returned None"), "load", True, (Outcome.CRASH, "user", "factory")),
    (RuntimeError("boom"), "train", False, (Outcome.CRASH, "", "error")),
])
def test_classify_exception(exc, stage, user, expected):
    assert classify_exception(exc, stage=stage, user_factory=user) == expected


def test_who_raised_decides_between_the_user_and_the_library():
    mine = raised(ValueError("my factory does not support 4-bit"))
    assert classify_exception(mine, stage="load", user_factory=True) == (Outcome.CRASH, "user", "factory")
    theirs = raised_in_library()
    assert classify_exception(theirs, stage="load", user_factory=True) == (Outcome.INVALID, "", "rejected")
    # the same exception during training, or from a built-in factory, is never the user's
    assert classify_exception(mine, stage="train", user_factory=True)[1] == ""
    assert classify_exception(mine, stage="load", user_factory=False)[1] == ""


def test_killed_probes_are_infrastructure():
    assert classify_exit(-9, timed_out=False).fault == "infrastructure"
    assert classify_exit(None, timed_out=True).fault == ""  # a slow candidate is the candidate's


def candidate(mb: int) -> Candidate:
    return Candidate("sft", "tiny-qwen2", "cpu", micro_batch=mb, grad_accum=8 // mb, max_length=64)


def crash(message: str, **kw) -> ProbeResult:
    return ProbeResult(Outcome.CRASH, error=message, error_phase="load", log_path="/x/probe.log", **kw)


def test_a_user_fault_stops_at_once_with_the_users_frames():
    watch = FaultWatch(user_factory=True)
    with pytest.raises(FactoryError, match=r"your trainer factory failed \(mb=8x1 len=64\): NameError") as info:
        watch.observe(candidate(8), crash("NameError: name 'tokenizr' is not defined", fault="user",
                                         detail='  File "train.py", line 12, in make_trainer'))
    assert "train.py" in str(info.value) and "/x/probe.log" in str(info.value)


def test_the_same_error_twice_stops_on_the_second_candidate():
    watch = FaultWatch(user_factory=False)
    watch.observe(candidate(8), crash("KeyError: 'vocab_size' at 0x7f00"))
    watch.observe(candidate(8), crash("KeyError: 'vocab_size' at 0x7f11"))  # the same candidate again: no
    with pytest.raises(InfrastructureError, match="same error on 2 different candidates"):
        watch.observe(candidate(4), crash("KeyError: 'vocab_size' at 0x7f22"))  # addresses do not matter


def test_with_a_users_factory_a_repeated_error_is_theirs_unless_the_machine_s():
    user = FaultWatch(user_factory=True)
    user.observe(candidate(8), crash("OSError: model path 'my-model' not found"))
    with pytest.raises(FactoryError, match="fails the same way on two candidates"):
        user.observe(candidate(4), crash("OSError: model path 'my-model' not found"))
    machine = FaultWatch(user_factory=True)
    machine.observe(candidate(8), crash("OSError: No space left on device", fault="infrastructure", cause="disk"))
    with pytest.raises(InfrastructureError, match="free disk space"):
        machine.observe(candidate(4), crash("OSError: No space left on device", fault="infrastructure", cause="disk"))


def test_out_of_memory_and_rejected_combinations_never_stop_the_search():
    watch = FaultWatch(user_factory=True)
    for mb in (8, 4, 2, 1):
        watch.observe(candidate(mb), ProbeResult(Outcome.OOM, error="CUDA out of memory", error_phase="train"))
        watch.observe(candidate(mb), ProbeResult(Outcome.INVALID, error="ValueError: 4-bit needs a GPU",
                                                 error_phase="load"))


class _Record:
    def __init__(self, result):
        self.result = result


def test_nothing_fits_only_when_memory_said_so():
    oom = _Record(ProbeResult(Outcome.OOM, error="out of memory"))
    invalid = _Record(ProbeResult(Outcome.INVALID, error="ValueError: refused"))
    check_no_fit_is_an_answer([invalid, oom], skipped=False)  # an OOM: an answer
    check_no_fit_is_an_answer([invalid], skipped=True)  # the model ruled the rest out: an answer
    check_no_fit_is_an_answer([], skipped=True)
    with pytest.raises(InfrastructureError, match="no probe ran out of memory"):
        check_no_fit_is_an_answer([invalid], skipped=False)


def test_an_errors_origin_is_named():
    from autofit.probe._classify import error_origin

    mine = raised(ValueError("my own check"))
    assert error_origin(mine, "load", user_factory=True) == "your factory"
    assert error_origin(raised_in_library(), "load", user_factory=True) == "building the trainer"  # the stdlib
    assert error_origin(mine, "train", user_factory=True) == "training"
    assert error_origin(mine, "setup", user_factory=False) == "setup"
    try:
        from trl import GRPOConfig

        GRPOConfig(output_dir="/tmp/x", use_cpu=True, per_device_train_batch_size=2, num_generations=3)
    except ValueError as exc:  # "generation_batch_size (2) must be divisible by num_generations (3)"
        assert error_origin(exc, "load", user_factory=True) == "the config's validation"
    else:
        pytest.fail("TRL accepted groups that do not divide the batch")
    try:
        from transformers import AutoConfig

        AutoConfig.for_model("no-such-model-type")
    except ValueError as exc:
        assert error_origin(exc, "load", user_factory=True) == "the model"
