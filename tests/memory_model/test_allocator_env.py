"""Issue 50, item 6: a TRL file's ``env: {PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True}`` (the name most launch
files still carry; torch reads it where PYTORCH_ALLOC_CONF is unset) left the estimate exactly as without it, though
the expandable-segments rung changes the allocator's term. The legacy name now counts, the newer wins where both are
set (as in torch), and the rung keeps the user's other allocator options under either name."""

from __future__ import annotations

from autofit import cli
from autofit.core import Candidate
from autofit.rungs import RUNGS, LadderState, allocator_options

FILE = """model_name_or_path: Qwen/Qwen2.5-0.5B
per_device_train_batch_size: 4
max_length: 512
"""


def _estimate(tmp_path, capsys, env_block: str) -> str:
    path = tmp_path / "sft.yaml"
    path.write_text(FILE + env_block)
    assert cli.main(["estimate", "--config", str(path), "--gpu-memory", "24GiB"]) == 0
    out = capsys.readouterr().out
    return next(line for line in out.splitlines() if line.startswith("your run"))


def test_the_legacy_allocator_name_in_a_file_changes_the_estimate(tmp_path, capsys):
    plain = _estimate(tmp_path, capsys, "")
    legacy = _estimate(tmp_path, capsys, "env:\n  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True\n")
    newer = _estimate(tmp_path, capsys, "env:\n  PYTORCH_ALLOC_CONF: expandable_segments:True\n")
    assert legacy != plain and legacy.replace("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") == newer
    both = _estimate(tmp_path, capsys, "env:\n  PYTORCH_ALLOC_CONF: max_split_size_mb:128\n"
                                       "  PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True\n")
    assert both == plain  # torch reads the newer name alone: the legacy one's expandable segments are not in effect


def test_allocator_options_follow_torchs_precedence():
    assert allocator_options({}) == ""
    assert allocator_options({"PYTORCH_CUDA_ALLOC_CONF": "a:1"}) == "a:1"
    assert allocator_options({"PYTORCH_CUDA_ALLOC_CONF": "a:1", "PYTORCH_ALLOC_CONF": "b:2"}) == "b:2"


def test_the_rung_keeps_the_users_options_given_under_the_legacy_name():
    rung = RUNGS["expandable-segments"]
    base = dict(algo="sft", model="Qwen/Qwen2.5-0.5B", device="cuda", micro_batch=4, grad_accum=1, max_length=512)
    on = Candidate(**base, env=(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),))
    assert rung.apply(LadderState(on)) is None  # already on: nothing to climb
    other = Candidate(**base, env=(("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128"),))
    applied = rung.apply(LadderState(other))
    assert applied is not None
    assert allocator_options(dict(applied.candidate.env)) == "max_split_size_mb:128,expandable_segments:True"
