"""CUDA checks (skipped without a GPU). Never run in CI; run with `make gpu-test` on a CUDA machine."""

import json

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_emulated_budget_holds_for_qwen_0_5b_sft(tmp_path):
    from autofit import cli

    code = cli.main(["search", "--model", "Qwen/Qwen2.5-0.5B", "--gpu-memory", "12GiB", "--max-length", "1024",
                     "--out", str(tmp_path)])
    best = json.loads((tmp_path / "best.json").read_text())
    assert code == 0 and best["fits"]
    assert best["verified"]["peak_bytes"] <= 12 * 2**30
    assert best["verified"]["stats"]["context_bytes"] > 0  # the CUDA context is counted


def test_cuda_oom_is_classified(tmp_path):
    from autofit.core import Candidate, Outcome
    from autofit.probe import ProcessRunner

    runner = ProcessRunner("autofit.probe.algos.sft:build_trainer", 2 * 2**30, tmp_path)
    result = runner.run(Candidate("sft", "Qwen/Qwen2.5-0.5B", "cuda", micro_batch=64, grad_accum=1,
                                  max_length=4096), 2)
    assert result.outcome is Outcome.OOM, result.error
