"""The library versions autofit declares: the checkpointing field that exists, and real probes of every built-in
algorithm (``make test-floor`` runs the ``floor`` tests with the lowest declared transformers, trl and optuna)."""

import dataclasses

import pytest
from packaging.version import Version

from autofit.core import Candidate, Outcome, algorithm
from autofit.core import _compat as compat
from autofit.probe import ProcessRunner


@pytest.fixture
def transformers_version(monkeypatch):
    def use(version: str):
        monkeypatch.setattr(compat, "installed", lambda package: Version(version))

    return use


def test_checkpointing_is_written_with_the_field_transformers_has(transformers_version):
    candidate = Candidate("sft", "tiny-qwen2", "cpu", micro_batch=2, grad_accum=4, max_length=64, checkpointing=True)
    transformers_version("5.17.0")  # the GPU image's: no activation_checkpointing field yet
    args = candidate.training_args()
    assert args["gradient_checkpointing"] is True and "activation_checkpointing" not in args
    transformers_version("4.56.2")
    assert "activation_checkpointing" not in candidate.training_args()
    transformers_version("5.23.0")  # the rename: only the new name, or the old one could silently stay on
    args = candidate.training_args()
    assert args["activation_checkpointing"] is True and "gradient_checkpointing" not in args


def test_the_installed_config_class_has_the_field_autofit_writes():
    from trl import SFTConfig

    assert compat.checkpointing_field() in {field.name for field in dataclasses.fields(SFTConfig)}


@pytest.mark.slow
@pytest.mark.floor
@pytest.mark.parametrize("algo", ["sft", "grpo", "rloo", "reward"])
def test_every_built_in_algorithm_probes_with_and_without_checkpointing(tmp_path, algo):
    # RL probes generate their completions token by token: 32 of them show checkpointing's saving as 64 did
    extra = dict(num_generations=2, prompt_length=16, max_length=32) if algo in ("grpo", "rloo") else {"max_length": 64}
    runner = ProcessRunner(algorithm(algo).factory, None, tmp_path)
    plain = Candidate(algo, "tiny-qwen2", "cpu", micro_batch=4, grad_accum=1, **extra)
    results = {ckpt: runner.run(plain.replace(checkpointing=ckpt), 2) for ckpt in (False, True)}
    for result in results.values():
        assert result.outcome is Outcome.OK, result.error
    # the field took effect: recomputation keeps fewer activations than saving them all
    assert results[True].phase_peaks["forward_backward"] < results[False].phase_peaks["forward_backward"]
