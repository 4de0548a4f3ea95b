"""The user's mistakes named as theirs (issue 35, item 13): a factory that ends the probe process itself, a model
configuration no attention could be built from, a batch in the config file that is not a batch. Each was exit 4
("probes cannot run here") or a flag the user never gave; each is now exit 2, naming the user's key or code."""

import json

import pytest

from autofit import cli
from autofit.core import USER, Outcome
from autofit.machine import resolve_model
from autofit.probe._classify import classify_exit

SEARCH = ["search", "--model", "tiny-qwen2", "--device", "cpu", "--max-length", "16", "--effective-batch", "2"]


def test_a_probe_that_exits_by_itself_while_the_users_factory_builds_is_the_factorys():
    result = classify_exit(0, False, phase="load", user_factory=True)
    assert result.outcome is Outcome.CRASH and result.fault == USER and "os._exit" in result.error
    assert classify_exit(0, False, phase="load", user_factory=False).fault != USER  # a built-in factory: ours
    assert classify_exit(0, False, phase="train", user_factory=True).fault != USER
    assert classify_exit(-9, False, phase="load", user_factory=True).cause == "signal-SIGKILL"  # the host's


def test_a_factory_calling_os_exit_is_named_as_the_factorys_not_the_machines(tmp_path, capsys):
    code = cli.main(SEARCH + ["--gpu-memory", "1GiB", "--out", str(tmp_path / "out"), "-q", "--factory",
                              "probe_factories:exits_quietly"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "your trainer factory failed" in err and "os._exit" in err and "probes cannot run here" not in err


@pytest.mark.parametrize("key, value, named", [
    ("torch_dtype", "garbage", "torch_dtype"),
    ("num_attention_heads", 3, "num_attention_heads = 3, which does not divide hidden_size = 256"),
    ("num_key_value_heads", 8, "num_key_value_heads = 8 for num_attention_heads = 4"),
    ("num_key_value_heads", 3, "num_key_value_heads = 3"),
])
def test_a_model_configuration_no_attention_could_be_built_from_is_exit_2_up_front(tmp_path, capsys, key, value,
                                                                                    named):
    """They ended in exit 4 after one or two probes ("probes cannot run here"), blaming the machine."""
    config = dict(resolve_model("tiny-qwen2").config)
    config[key] = value
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    code = cli.main(SEARCH + ["--model", str(folder), "--gpu-memory", "1GiB", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert named in err and str(folder / "config.json") in err
    assert not (out / "probes").exists()  # nothing ran


def test_a_head_width_of_its_own_lets_heads_not_divide_the_hidden_size(tmp_path):
    config = dict(resolve_model("tiny-qwen2").config, num_attention_heads=3, num_key_value_heads=1, head_dim=64)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert resolve_model(str(tmp_path)).config["num_attention_heads"] == 3


BATCH_ACCEPTED = "a whole number from 1 to 65,536 is accepted"


@pytest.mark.parametrize("line, named", [
    ("per_device_train_batch_size: -4", f"per_device_train_batch_size = -4: {BATCH_ACCEPTED}"),
    ("gradient_accumulation_steps: 0", f"gradient_accumulation_steps = 0: {BATCH_ACCEPTED}"),
    ("max_length: -5", "max_length = -5 is not valid"),
])
def test_a_bad_batch_in_the_file_is_named_as_the_files_key(tmp_path, capsys, line, named):
    """``per_device_train_batch_size: -4`` was reported as ``--effective-batch -8 is not valid``."""
    path = tmp_path / "sft.yaml"
    path.write_text(f"model_name_or_path: tiny-qwen2\n{line}\n")
    code = cli.main(["estimate", "--config", str(path), "--device", "cpu", "--gpu-memory", "1GiB"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"autofit: error: --config {path}: {named}") and "--effective-batch" not in err
