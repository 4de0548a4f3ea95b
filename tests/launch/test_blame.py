"""Issue 50, item 5: say where the mistake is. A launch's flag was blamed on the file's key, a missing
``accelerate launch --config_file`` on ``--accelerate-config`` (which the user never typed), and 45,000 unknown keys of
an accelerate file made one 5.4 MB note."""

from __future__ import annotations

from pathlib import Path

from autofit import cli
from autofit.launch._accelerate_keys import accelerate_notes

TRL_FILE = """model_name_or_path: tiny-qwen2
max_length: 64
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
"""


def _refused(capsys, argv) -> str:
    code = cli.main(argv)
    out = capsys.readouterr()
    assert code == 2 and out.err.count("\n") == 1 and "Traceback" not in out.err, out.err
    return out.err


def test_a_launch_flag_is_named_as_the_flag_not_as_the_files_key(tmp_path: Path, capsys):
    config = tmp_path / "sft.yaml"
    config.write_text(TRL_FILE)
    err = _refused(capsys, ["estimate", "--gpu-memory", "80GiB", "--", "trl", "sft", "--config", str(config),
                            "--gradient_accumulation_steps", "0"])
    assert "the launch's flag --gradient_accumulation_steps = 0" in err and "--config" not in err, err
    config.write_text(TRL_FILE.replace("accumulation_steps: 1", "accumulation_steps: 0"))
    err = _refused(capsys, ["estimate", "--gpu-memory", "80GiB", "--config", str(config)])
    assert f"--config {config}: gradient_accumulation_steps = 0" in err  # the file's own key: named as it was


def test_a_missing_accelerate_config_file_is_named_as_the_launch_typed_it(tmp_path: Path, capsys):
    config = tmp_path / "sft.yaml"
    config.write_text(TRL_FILE)
    err = _refused(capsys, ["estimate", "--gpu-memory", "80GiB", "--", "accelerate", "launch", "--config_file",
                            "missing.yaml", "-m", "trl", "sft", "--config", str(config)])
    assert "accelerate launch --config_file missing.yaml: no such file" in err and "--accelerate-config" not in err


def test_thousands_of_unknown_keys_make_one_short_note():
    values = {"distributed_type": "MULTI_GPU", **{f"key_{n}": "x" * 1000 for n in range(45_000)}}
    [note] = accelerate_notes(values, "accelerate config big.yaml")
    assert note.startswith("45000 keys of accelerate's config autofit's key table does not know in accelerate "
                           "config big.yaml: key_0: 'xxx") and note.endswith("; and 44992 more")
    assert len(note) < 2_000
    [one] = accelerate_notes({"distributed_type": "MULTI_GPU", "gpu_ids_typo": "all"}, "f.yaml")
    assert one == "gpu_ids_typo: 'all' in f.yaml (a key of accelerate's config autofit's key table does not know)"


def test_an_unknown_option_of_the_launch_is_named_as_typed_not_as_the_files(tmp_path: Path, capsys):
    """An accelerate option or a TRL flag neither takes was "--config f.yaml: ... from config file ... is the file for
    another trainer? --algo"; a key the file wrote still is the file's."""
    config = tmp_path / "sft.yaml"
    config.write_text(TRL_FILE)
    err = _refused(capsys, ["estimate", "--gpu-memory", "80GiB", "--", "accelerate", "launch", "--bogus_option", "3",
                            "-m", "trl", "sft", "--config", str(config)])
    assert err == "autofit: error: accelerate launch --bogus_option: not an option accelerate launch takes\n"
    err = _refused(capsys, ["estimate", "--gpu-memory", "80GiB", "--", "trl", "sft", "--config", str(config),
                            "--bogus_flag", "3"])
    assert err == "autofit: error: the launch's flag --bogus_flag: not an option TRL's sft command takes\n"
    config.write_text(TRL_FILE + "bogus_key: 1\n")
    err = _refused(capsys, ["estimate", "--gpu-memory", "80GiB", "--config", str(config)])
    assert err.startswith(f"autofit: error: --config {config}: ") and "--bogus_key" in err


def test_a_second_separator_in_the_launch_is_named_not_read_as_accelerates_options(tmp_path: Path, capsys):
    """``-- trl sft --config f.yaml -- --num_processes 2`` was read as a two-GPU run: autofit keeps a ``--`` of its
    own before accelerate's options. TRL's parser ends its options at a ``--``; autofit says so."""
    config = tmp_path / "sft.yaml"
    config.write_text(TRL_FILE)
    err = _refused(capsys, ["estimate", "--gpu-memory", "80GiB", "--", "trl", "sft", "--config", str(config), "--",
                            "--num_processes", "2"])
    assert "the launch 'trl sft' has a '--' of its own (-- --num_processes 2)" in err


def test_a_value_accelerate_launch_refuses_is_named_as_accelerates(tmp_path: Path, capsys):
    config = tmp_path / "sft.yaml"
    config.write_text(TRL_FILE)
    err = _refused(capsys, ["estimate", "--gpu-memory", "80GiB", "--", "accelerate", "launch", "--mixed_precision",
                            "bf17", "-m", "trl", "sft", "--config", str(config)])
    assert err.startswith("autofit: error: accelerate launch --mixed_precision") and "'bf17'" in err
    assert "--config" not in err and "TRL" not in err


def test_a_batch_size_the_file_writes_is_named_as_the_files_key(tmp_path: Path, capsys):
    config = tmp_path / "sft.yaml"
    config.write_text(TRL_FILE.replace("per_device_train_batch_size: 2", "per_device_train_batch_size: 100000000"))
    err = _refused(capsys, ["estimate", "--gpu-memory", "80GiB", "--config", str(config)])
    assert f"--config {config}: per_device_train_batch_size = 100000000: a whole number from 1 to 65,536" in err
