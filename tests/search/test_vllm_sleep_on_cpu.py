"""A file that puts vLLM to sleep, searched on the simulated device where vLLM (its CPU build) is installed: refused at
the question in one line, exit 2, before any probe (issue 59). The CPU build has no sleep mode ("Sleep mode is not
supported on current platform"), so every probe would fail and the search end at exit 4. vLLM's CPU build is the
vLLM lane's; here its presence is stood in for (``vllm_installed``), since the refusal comes before vLLM is imported."""

from __future__ import annotations

from autofit import cli
from autofit.search import _question


def _search(tmp_path, monkeypatch, capsys, sleep: str) -> tuple:
    monkeypatch.setattr(_question, "vllm_installed", lambda: True)
    config = tmp_path / "grpo.yaml"
    config.write_text(f"use_vllm: true\nvllm_mode: colocate\nvllm_enable_sleep_mode: {sleep}\n")
    out = tmp_path / "out"
    code = cli.main(["search", "--model", "tiny-qwen2", "--algo", "grpo", "--device", "cpu", "--gpu-memory", "2GiB",
                     "--config", str(config), "--out", str(out)])
    return code, capsys.readouterr().err.strip().splitlines(), out


def test_a_sleeping_vllm_is_refused_on_the_simulated_device(tmp_path, monkeypatch, capsys):
    code, err, out = _search(tmp_path, monkeypatch, capsys, "true")
    assert code == 2
    assert "vllm_enable_sleep_mode: true" in err[-1] and "no sleep mode" in err[-1] and "on a GPU" in err[-1]
    assert not (out / "best.yaml").exists()
