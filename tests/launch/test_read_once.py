"""Issue 45, item 2: a ``--config`` search reads the user's launch once, at the door, and the value travels on the
spec: the file and the accelerate config are opened once, TRL's parser runs once, and no module keeps a global cache
of either (the export writes best.yaml from the spec's file)."""

from __future__ import annotations

from collections import Counter

import pytest
from fakes import FormulaRunner

from autofit import cli
from autofit.launch import _accelerate_file, _trl_file

SFT = """model_name_or_path: tiny-qwen2
max_length: 64
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 3.0e-5
accelerate_config: {accelerate}
"""
ACCELERATE = "distributed_type: 'NO'\nmixed_precision: 'no'\nnum_processes: 1\n"


@pytest.fixture
def counted(monkeypatch):
    """Every file the launch's reading opens, and every run of TRL's parser, counted; probes by a formula."""
    opened, parsed = Counter(), Counter()
    read_text, parse = _trl_file.read_config_text, _trl_file.read_trl_config

    def read_counted(path):
        opened[path] += 1
        return read_text(path)

    def parse_counted(algo, path, *args):
        parsed[path] += 1
        return parse(algo, path, *args)

    for module in (_trl_file, _accelerate_file):
        monkeypatch.setattr(module, "read_config_text", read_counted)
    monkeypatch.setattr(_trl_file, "read_trl_config", parse_counted)
    monkeypatch.setattr("autofit._api.ProcessRunner", lambda payload, budget, *args, **kwargs: FormulaRunner(budget))
    monkeypatch.setattr("autofit._api.write_report", lambda out_dir: None)  # report.html reads best.json only
    return opened, parsed


@pytest.mark.parametrize("door", ["search", "estimate"])
def test_one_config_search_reads_its_launch_once(tmp_path, counted, capsys, door):
    opened, parsed = counted
    accelerate = tmp_path / "accelerate.yaml"
    accelerate.write_text(ACCELERATE)
    config = tmp_path / "sft.yaml"
    config.write_text(SFT.format(accelerate=accelerate))
    argv = [door, "--device", "cpu", "--gpu-memory", "2GiB" if door == "search" else "2GiB,4GiB"]
    argv += ["--out", str(tmp_path / "out")] if door == "search" else []
    code = cli.main([*argv, "--", "trl", "sft", "--config", str(config), "--learning_rate", "1e-4"])
    assert code == 0, capsys.readouterr().err
    assert opened == {str(config): 1, str(accelerate): 1}  # the estimate of two cards too
    assert parsed == {str(config): 1}
    if door == "search":
        best = (tmp_path / "out" / "best.yaml").read_text()
        assert "learning_rate: 0.0001" in best or "learning_rate: 1.0e-4" in best  # the launch's flag, folded in


def test_a_launch_read_again_is_read_again(tmp_path):
    """What was read lives on the spec, not in a module's cache: a file edited between two searches is the edited
    file the second time (the cache of the last round served the first)."""
    from autofit.launch import read_launch

    accelerate = tmp_path / "accelerate.yaml"
    accelerate.write_text(ACCELERATE)
    config = tmp_path / "sft.yaml"
    config.write_text(SFT.format(accelerate=accelerate))
    first = read_launch({"config": str(config), "algo": "sft"})
    config.write_text(SFT.format(accelerate=accelerate).replace("3.0e-5", "2.0e-5"))
    accelerate.write_text(ACCELERATE.replace("num_processes: 1", "num_processes: 2"))
    again = read_launch({"config": str(config), "algo": "sft"})
    assert (first.file.training["learning_rate"], again.file.training["learning_rate"]) == (3e-5, 2e-5)
    assert (first.engine.processes, again.engine.processes) == (1, 2)
