"""GRPO/RLOO input checks and search invariants (fast: no training)."""

import tempfile

import pytest
from fakes import FormulaRunner, MiB, spec_of
from hypothesis import given, settings
from hypothesis import strategies as st

from autofit import cli
from autofit.core import InputError
from autofit.rungs import resolve_ladder
from autofit.search import Search


def exit_code(argv):
    """cli.main returns its code; argparse's own errors exit (SystemExit) with the same code 2."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


RL = ["search", "--model", "tiny-qwen2", "--algo", "grpo", "--device", "cpu", "--gpu-memory", "1GiB"]


@pytest.fixture(autouse=True)
def _no_probe(monkeypatch):
    """Bad input must be refused before any probe starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("a probe was started for bad input")

    monkeypatch.setattr("autofit._api.ProcessRunner", refuse)


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--num-generations", "1"], "--num-generations '1'"),
        (["--num-generations", "4", "--effective-batch", "6"], "--effective-batch 6"),
        (["--max-length", "64"], "--max-completion-length"),
        (["--beta", "-0.1"], "--beta '-0.1'"),
        (["--min-completion-length", "64", "--max-completion-length", "32"],
         "--min-completion-length 64 is above --max-completion-length 32"),
        (["--max-prompt-length", "0"], "'0'"),
    ],
)
def test_bad_rl_input_exits_2_with_one_line(capsys, extra, named):
    code = exit_code(RL + extra)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and named in err, err


@pytest.mark.parametrize("flag", [["--num-generations", "4"], ["--beta", "0.1"], ["--max-completion-length", "8"]])
def test_rl_flags_are_refused_for_sft(capsys, flag):
    code = exit_code(["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "1GiB", *flag])
    err = capsys.readouterr().err.strip()
    assert code == 2 and flag[0] in err and "sft" in err


def test_num_generations_of_one_is_refused_by_the_api(tmp_path):
    with pytest.raises(InputError, match="at least 2"):
        spec_of(model="tiny-qwen2", algo="grpo", budget_bytes=2**30, num_generations=1, out_dir=tmp_path)


@settings(max_examples=40, deadline=None)
@given(
    groups=st.integers(1, 6),
    num_generations=st.sampled_from([2, 3, 4, 8]),
    budget_mib=st.integers(40, 900),
    max_length=st.sampled_from([16, 64, 256]),
    min_fraction=st.sampled_from([1.0, 0.5, 0.25]),
    algo=st.sampled_from(["grpo", "rloo"]),
)
def test_every_rl_candidate_keeps_groups_and_effective_batch(groups, num_generations, budget_mib, max_length,
                                                             min_fraction, algo):
    effective = groups * num_generations
    with tempfile.TemporaryDirectory() as out:
        spec = spec_of(model="tiny-qwen2", algo=algo, budget_bytes=budget_mib * MiB, max_length=max_length,
                          min_length=max(1, int(max_length * min_fraction)), effective_batch=effective,
                          num_generations=num_generations, prompt_length=32, out_dir=out,
                          predict=False)  # the fake's formula is not the memory model's: probe everything
        runner = FormulaRunner(spec.budget_bytes, weight_bytes=20 * MiB, act_bytes_per_token=16 * 1024)
        report = Search(spec, runner, resolve_ladder(None)).run()
    assert runner.calls
    for call in runner.calls:
        candidate = call.candidate
        assert candidate.micro_batch * candidate.grad_accum == effective
        assert candidate.num_generations == num_generations
        assert (candidate.micro_batch * candidate.grad_accum) % num_generations == 0  # the generation batch
        assert spec.min_length <= candidate.max_length <= max_length
        assert candidate.prompt_length == 32
        args = candidate.training_args()
        assert args["max_completion_length"] == candidate.max_length and "max_length" not in args
    if report.fits:
        assert report.verified.peak_bytes <= spec.budget_bytes


def test_ppo_says_why_it_is_missing(capsys):
    code = exit_code(["search", "--model", "tiny-qwen2", "--algo", "ppo", "--device", "cpu", "--gpu-memory", "1GiB"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "TRL 1.13 removed PPOTrainer" in err and "installed trl" in err
