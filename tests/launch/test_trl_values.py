"""Issue 57, item 4: every value a user writes is checked before any probe, as TRL and vLLM would take it. A GRPO
file's ``vllm_max_model_length: -5`` answered exit 0 (best.yaml kept -5), a DPO file's ``beta: -1.0`` or ``.nan`` and
``-- trl dpo ... --beta -3`` exit 0 (GRPO's were refused), ``loss_type: no_such_loss`` two probes and exit 4, KTO's
``loss_type`` (TRL's parser checks its choices on the command line only) and negative weights exit 0,
``vllm_tensor_parallel_size: 8`` on one GPU exit 0, ``--workers 99999999999999999999`` hung building its slots and
``--gpus-for-probes 1_0`` was device 10. A model folder with ``auto_map`` trusted by the file's
``model_init_kwargs: {trust_remote_code: true}`` (as TRL loads it) ended in exit 4 after two probes with a hub URL
made of a cache path. Each refusal is now one line, exit 2, naming the key as written, the value and what is
accepted; what TRL and vLLM take is taken."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from fakes import refused_in_one_line as _refused

from autofit import cli
from autofit.core import SearchOptions
from autofit.launch._trl_values import DPO_LOSS_TYPES

PREFERENCE = """model_name_or_path: tiny-qwen2
max_length: 32
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
"""
GROUPS = """model_name_or_path: tiny-qwen2
max_completion_length: 16
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
num_generations: 2
"""
ESTIMATE = ["estimate", "--gpu-memory", "80GiB"]


def _write(tmp_path: Path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _accepted(capsys, argv) -> None:
    code = cli.main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err[-1500:]


def test_a_grpo_files_negative_vllm_context_is_refused_before_any_probe(tmp_path, capsys):
    config = _write(tmp_path, GROUPS + "use_vllm: true\nvllm_max_model_length: -5\n")
    out = tmp_path / "out"
    err = _refused(capsys, ["search", "--config", config, "--algo", "grpo", "--device", "cpu", "--gpu-memory", "2GiB",
                            "--out", str(out)])
    assert f"--config {config}: vllm_max_model_length = -5 is not valid: a positive number of tokens" in err
    assert not (out / "probes").exists()


def test_vllms_own_auto_context_is_refused_with_the_way_on(tmp_path, capsys):
    config = _write(tmp_path, GROUPS + "use_vllm: true\nvllm_max_model_length: -1\n")
    err = _refused(capsys, [*ESTIMATE, "--config", config, "--algo", "grpo"])
    assert "vllm_max_model_length = -1" in err and "does not model vLLM's -1" in err and "leave it unset" in err


def test_vllm_keys_are_checked_where_vllm_generates_only(tmp_path, capsys):
    """TRL reads no vllm_* key without use_vllm; the door's --use-vllm turns vLLM on for the file's keys too."""
    config = _write(tmp_path, GROUPS + "vllm_max_model_length: -5\nvllm_tensor_parallel_size: 8\n")
    _accepted(capsys, [*ESTIMATE, "--config", config, "--algo", "grpo"])
    err = _refused(capsys, [*ESTIMATE, "--config", config, "--algo", "grpo", "--use-vllm", "colocate"])
    assert "vllm_max_model_length = -5" in err


@pytest.mark.parametrize("gpus, accepted", [(None, False), ("2", False), ("8", True)])
def test_a_tensor_parallel_group_wider_than_the_gpus_is_refused(tmp_path, capsys, gpus, accepted):
    """TRL's colocated vLLM: "tensor_parallel_size must divide world size"; 8 on one GPU was exit 0."""
    config = _write(tmp_path, GROUPS + "use_vllm: true\nvllm_tensor_parallel_size: 8\n")
    argv = [*ESTIMATE, "--config", config, "--algo", "grpo"] + (["--gpus", gpus] if gpus else [])
    if accepted:
        _accepted(capsys, argv)
        return
    err = _refused(capsys, argv)
    assert f"vllm_tensor_parallel_size = 8 is not valid: a whole number from 1 that divides --gpus {gpus or 1}" in err


def test_in_server_mode_the_colocated_keys_are_not_checked_and_the_servers_are(tmp_path, capsys):
    config = _write(tmp_path, GROUPS + "use_vllm: true\nvllm_mode: server\nvllm_tensor_parallel_size: 8\n")
    _accepted(capsys, [*ESTIMATE, "--config", config, "--algo", "grpo"])
    config = _write(tmp_path, GROUPS + "use_vllm: true\nvllm_mode: server\nvllm_server_port: 0\n")
    assert "vllm_server_port = 0 is not valid: a port from 1 to 65535" in _refused(
        capsys, [*ESTIMATE, "--config", config, "--algo", "grpo"])
    config = _write(tmp_path, GROUPS + "use_vllm: true\nvllm_mode: server\nvllm_server_timeout: .nan\n")
    assert "vllm_server_timeout = nan" in _refused(capsys, [*ESTIMATE, "--config", config, "--algo", "rloo"])


@pytest.mark.parametrize("line, named", [
    ("vllm_model_impl: fast", "vllm_model_impl = 'fast' is not valid: one of vLLM's auto, vllm, transformers"),
    ("vllm_importance_sampling_mode: bogus", "vllm_importance_sampling_mode = 'bogus' is not valid: one of "
                                             "token_truncate"),
    ("vllm_gpu_memory_utilization: 1.5", "vllm_gpu_memory_utilization = 1.5 is not valid: a share of the GPU above 0 "
                                         "and at most 1"),
    ("vllm_mode: bogus", "vllm_mode = 'bogus' is not valid"),
])
def test_a_vllm_value_vllm_or_trl_refuses_is_named(tmp_path, capsys, line, named):
    config = _write(tmp_path, GROUPS + "use_vllm: true\n" + line + "\n")
    assert named in _refused(capsys, [*ESTIMATE, "--config", config, "--algo", "grpo"])


def test_the_whole_card_is_a_share_vllm_takes(tmp_path, capsys):
    """vLLM's gpu_memory_utilization is Field(gt=0, le=1): 1.0 was refused as "a fraction between 0 and 1"."""
    config = _write(tmp_path, GROUPS + "use_vllm: true\nvllm_gpu_memory_utilization: 1.0\n")
    _accepted(capsys, [*ESTIMATE, "--config", config, "--algo", "grpo"])
    _accepted(capsys, [*ESTIMATE, "--model", "tiny-qwen2", "--algo", "grpo", "--use-vllm", "colocate",
                       "--vllm-gpu-memory-utilization", "1"])


@pytest.mark.parametrize("algo", ["dpo", "kto"])
@pytest.mark.parametrize("value", ["-1.0", ".nan", ".inf"])
def test_a_preference_files_kl_coefficient_is_refused_as_grpos_is(tmp_path, capsys, algo, value):
    config = _write(tmp_path, PREFERENCE + f"beta: {value}\n")
    err = _refused(capsys, [*ESTIMATE, "--config", config, "--algo", algo])
    assert f"--config {config}: beta = " in err and "a finite number, 0 or more, is accepted" in err
    grpo = _write(tmp_path, GROUPS + f"beta: {value}\n", "grpo.yaml")
    assert "a finite number, 0 or more, is accepted" in _refused(capsys, [*ESTIMATE, "--config", grpo, "--algo",
                                                                          "grpo"])


def test_a_launch_flags_beta_is_named_as_the_flag(tmp_path, capsys):
    config = _write(tmp_path, PREFERENCE)
    err = _refused(capsys, [*ESTIMATE, "--", "trl", "dpo", "--config", config, "--beta", "-3"])
    assert "the launch's flag --beta = -3.0 is not valid: a finite number, 0 or more" in err and "--config" not in err
    _accepted(capsys, [*ESTIMATE, "--", "trl", "dpo", "--config", config, "--beta", "0"])


@pytest.mark.parametrize("line, value", [("loss_type: no_such_loss", "'no_such_loss'"),
                                         ("loss_type: [sigmoid, bogus]", "['sigmoid', 'bogus']")])
def test_a_dpo_loss_trl_does_not_compute_is_refused_before_any_probe(tmp_path, capsys, line, value):
    """It was two probes, then exit 4: DPOTrainer raises "Unknown loss type" at its first loss only."""
    config = _write(tmp_path, PREFERENCE + line + "\n")
    out = tmp_path / "out"
    err = _refused(capsys, ["search", "--config", config, "--algo", "dpo", "--device", "cpu", "--gpu-memory", "2GiB",
                            "--out", str(out)])
    assert f"--config {config}: loss_type = {value} is not valid: the loss types DPOTrainer computes" in err
    assert "sigmoid_norm" in err and not (out / "probes").exists()


def test_the_dpo_loss_types_are_the_installed_trls():
    from trl import DPOConfig

    help_text = next(f for f in DPOConfig.__dataclass_fields__.values() if f.name == "loss_type").metadata["help"]
    listed = help_text.split("Possible values are:", 1)[1].split(". If", 1)[0]
    assert tuple(re.findall(r"`'([a-z_]+)'`", listed)) == DPO_LOSS_TYPES


@pytest.mark.parametrize("lines, named", [
    ("loss_type: robust\nlabel_smoothing: 0.5\n", "label_smoothing = 0.5 is not valid: from 0 to below 0.5 for the "
                                                  "robust loss"),
    ("loss_type: robust\nlabel_smoothing: -0.1\n", "label_smoothing = -0.1"),
    ("loss_type: exo_pair\n", "label_smoothing = 0.0 is not valid: above 0 and below 1 for the exo_pair loss"),
    ("loss_type: [sigmoid, aot]\nlabel_smoothing: 1.5\n", "label_smoothing = 1.5 is not valid: a probability"),
    ("f_divergence_type: kl\n", "f_divergence_type = 'kl' is not valid: one of reverse_kl"),
    ("loss_type: bco_pair\nf_divergence_type: forward_kl\n", "f_divergence_type = 'forward_kl' is not valid"),
    ("ld_alpha: 2.0\n", "ld_alpha = 2.0 is not valid: a number from 0 to 1"),
    ("loss_type: discopop\ndiscopop_tau: 0.0\n", "discopop_tau = 0.0 is not valid"),
    ("loss_type: aot\nuse_weighting: true\n", "use_weighting = True is not valid"),
    ("truncation_mode: keep_middle\n", "truncation_mode = 'keep_middle' is not valid: one of keep_end, keep_start"),
])
def test_a_dpo_value_trl_refuses_or_divides_by_is_named(tmp_path, capsys, lines, named):
    config = _write(tmp_path, PREFERENCE + lines)
    assert f"--config {config}: {named}" in _refused(capsys, [*ESTIMATE, "--config", config, "--algo", "dpo"])


@pytest.mark.parametrize("lines", [
    "loss_type: [sigmoid, sft]\nloss_weights: [0.5, 0.5]\n",
    "loss_type: robust\nlabel_smoothing: 0.1\n",
    "label_smoothing: 0.7\n",  # the sigmoid loss does not read it
    "loss_type: exo_pair\nlabel_smoothing: 0.001\n",
    "beta: 0.0\nf_divergence_type: js_divergence\nld_alpha: 0.5\n",
])
def test_what_dpo_takes_is_taken(tmp_path, capsys, lines):
    config = _write(tmp_path, PREFERENCE + lines)
    _accepted(capsys, [*ESTIMATE, "--config", config, "--algo", "dpo"])


@pytest.mark.parametrize("line, named", [
    ("loss_type: no_such_loss", "loss_type = 'no_such_loss' is not valid: one of kto, apo_zero_unpaired"),
    ("desirable_weight: -1.0", "desirable_weight = -1.0 is not valid: a finite weight, 0 or more"),
    ("undesirable_weight: .nan", "undesirable_weight = nan is not valid"),
    ("train_sampling_strategy: shuffled", "train_sampling_strategy = 'shuffled' is not valid: one of random"),
])
def test_a_kto_value_is_named(tmp_path, capsys, line, named):
    config = _write(tmp_path, PREFERENCE + line + "\n")
    assert f"--config {config}: {named}" in _refused(capsys, [*ESTIMATE, "--config", config, "--algo", "kto"])


def test_kto_weights_of_zero_and_its_other_loss_are_taken(tmp_path, capsys):
    config = _write(tmp_path, PREFERENCE + "loss_type: apo_zero_unpaired\ndesirable_weight: 0.0\n")
    _accepted(capsys, [*ESTIMATE, "--config", config, "--algo", "kto"])


def test_a_key_this_trl_has_not_is_trls_own_refusal(tmp_path, capsys):
    """rpo_alpha left DPOConfig before TRL 1.16: its parser refuses the key, named."""
    config = _write(tmp_path, PREFERENCE + "rpo_alpha: 0.5\n")
    err = _refused(capsys, [*ESTIMATE, "--config", config, "--algo", "dpo"])
    assert "--rpo_alpha" in err and "keys TRL's dpo command does not take" in err


@pytest.mark.parametrize("value", ["99999999999999999999", "1025", "0", "1_0"])
def test_workers_are_counted_up_to_a_bound(tmp_path, capsys, value):
    err = _refused(capsys, ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "1GiB",
                            "--workers", value, "--out", str(tmp_path / "out")])
    assert f"--workers {value!r} is not valid: a whole number of workers from 1 to 1024" in err
    assert SearchOptions(model="tiny-qwen2", workers=1024).workers == 1024


@pytest.mark.parametrize("value", ["1_0", "0,1_0", "\u0661", "0x1"])
def test_device_indices_are_digits_as_typed_by_the_search_and_the_worker(tmp_path, capsys, value):
    """Python's int() read '1_0' as device 10 (and Arabic-Indic digits as ours)."""
    err = _refused(capsys, ["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "1GiB",
                            "--gpus-for-probes", value, "--out", str(tmp_path / "out")])
    assert f"--gpus-for-probes {value!r} is not valid: distinct device indices" in err
    err = _refused(capsys, ["worker", "--study", str(tmp_path / "queue"), "--gpus-for-probes", value])
    assert "--gpus-for-probes" in err and "distinct device indices" in err


def test_other_counts_are_digits_too(tmp_path, capsys):
    err = _refused(capsys, [*ESTIMATE, "--model", "tiny-qwen2", "--effective-batch", "1_6"])
    assert "--effective-batch '1_6' is not valid: a positive integer" in err
    _accepted(capsys, [*ESTIMATE, "--model", "tiny-qwen2", "--effective-batch", " 16 "])


def _own_code_model(folder: Path, marker: Path, model_type: str) -> Path:
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from machine.test_files import custom_code_model

    custom_code_model(folder, marker)
    if model_type != "marker_lm":  # a type transformers knows, with code of its own beside it (auto_map)
        config = json.loads((folder / "config.json").read_text())
        config.update(model_type=model_type, architectures=["Qwen2ForCausalLM"])
        (folder / "config.json").write_text(json.dumps(config))
        code = (folder / "modeling_marker.py").read_text().replace("'marker_lm'", repr(model_type))
        (folder / "modeling_marker.py").write_text(code)
    return folder


def test_a_models_code_trusted_by_model_init_kwargs_goes_with_the_probes_checkpoint(tmp_path, monkeypatch):
    """TRL loads the model with the file's model_init_kwargs (its scripts put them over ModelConfig's): the folder's
    code runs. The probes' checkpoint had no module beside it, and a cached one built without the code was reused."""
    from autofit.core import Candidate
    from autofit.probe import kit

    monkeypatch.setenv("AUTOFIT_CACHE", str(tmp_path / "cache"))
    folder = _own_code_model(tmp_path / "model", tmp_path / "ran", "qwen2")
    fields = dict(algo="sft", model=str(folder), device="cpu", micro_batch=1, grad_accum=1, max_length=16)
    plain = Path(kit.model_path(Candidate(**fields)))
    assert not (plain / "modeling_marker.py").exists()
    trusted = Path(kit.model_path(Candidate(**fields, user_args={"model_init_kwargs": {"trust_remote_code": True}})))
    assert trusted != plain and (trusted / "modeling_marker.py").is_file()
    assert Path(kit.model_path(Candidate(**fields, trust_remote_code=True))) == trusted


def test_a_model_type_only_its_code_knows_is_taken_when_the_file_trusts_it(tmp_path, capsys):
    """It was "runs it only with --trust-remote-code", though the file's model_init_kwargs said so."""
    folder = _own_code_model(tmp_path / "model", tmp_path / "ran", "marker_lm")
    config = _write(tmp_path, PREFERENCE.replace("tiny-qwen2", str(folder)).replace("max_length: 32", "max_length: 16")
                    + "model_init_kwargs:\n  trust_remote_code: true\n")
    _accepted(capsys, ["estimate", "--gpu-memory", "2GiB", "--device", "cpu", "--config", config])
    untrusted = _write(tmp_path, PREFERENCE.replace("tiny-qwen2", str(folder)), "plain.yaml")
    err = _refused(capsys, ["estimate", "--gpu-memory", "2GiB", "--device", "cpu", "--config", untrusted])
    assert "'marker_lm'" in err and "model_init_kwargs: {trust_remote_code: true}" in err


@pytest.mark.slow
def test_a_search_of_a_folder_with_its_own_code_trusted_by_the_file_runs_it(tmp_path, capsys):
    folder = _own_code_model(tmp_path / "model", tmp_path / "ran", "qwen2")
    config = _write(tmp_path, PREFERENCE.replace("tiny-qwen2", str(folder)).replace("max_length: 32", "max_length: 16")
                    + "model_init_kwargs:\n  trust_remote_code: true\n")
    out = tmp_path / "out"
    code = cli.main(["search", "--config", config, "--device", "cpu", "--gpu-memory", "2GiB", "--effective-batch", "2",
                     "--verify-steps", "3", "-q", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err[-1500:]
    assert (tmp_path / "ran").exists() and json.loads((out / "best.json").read_text())["fits"]
