"""Real TRL RewardTrainer probes: the longest context that fits (--maximize length), with the ladder."""

import json

import pytest

from autofit import cli
from autofit.report import gather
from autofit.search import length_grid

pytestmark = pytest.mark.slow


def test_reward_model_longest_length_climbs_the_speed_rungs(tmp_path):
    from trl import ModelConfig, RewardConfig, TrlParser

    code = cli.main(["search", "--model", "tiny-qwen2", "--algo", "reward", "--device", "cpu", "--gpu-memory",
                     "120MiB", "--maximize", "length", "--max-length", "2048", "--min-length", "64",
                     "--effective-batch", "2", "--verify-steps", "3", "--out", str(tmp_path)])
    best = json.loads((tmp_path / "best.json").read_text())
    assert code == 0 and best["fits"]
    length = best["config"]["max_length"]
    probes = [c for c in best["candidates"] if c["kind"] == "probe"]

    def longest_fit(rungs):
        fits = [int(c["candidate"].split("len=")[1].split()[0]) for c in probes
                if c["rungs"] == rungs and c["outcome"] == "OK"]
        return max(fits, default=0)

    # each speed rung buys a longer context, and the longest one is chosen
    assert longest_fit([]) < longest_fit(["micro-batch"]) < longest_fit(["micro-batch", "checkpointing"]) == length
    assert best["rungs"] == ["micro-batch", "checkpointing"]
    assert best["cost_class"] == "speed"  # no quality rung: same training, longer sequences
    grid = length_grid(64, 2048)
    longer = grid[grid.index(length) + 1]
    assert any(c["outcome"] == "OOM" and f"len={longer} " in c["candidate"] + " " for c in probes
               if c["rungs"] == best["rungs"]), "the next longer length was probed and did not fit"
    assert best["verified"]["peak_bytes"] <= 120 * 2**20
    assert any("longest max_length that fits" in note for note in best["notes"])
    # the report's curve of each level passes through that level's own fitted points (issue 31, item 7: one
    # calibration for all levels left the checkpointing curve 4-5 MiB off its points)
    data = gather(tmp_path)
    for probe in data.probes:
        if probe.kind == "probe" and probe.outcome == "OK":
            curve = dict(data.curves[probe.level])
            assert curve[probe.candidate.max_length] == pytest.approx(probe.peak_bytes, rel=0.01), probe
    parsed, _ = TrlParser((RewardConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(tmp_path / "best.yaml"), "--output_dir", str(tmp_path / "run")]
    )
    assert parsed.max_length == length and parsed.activation_checkpointing is True
