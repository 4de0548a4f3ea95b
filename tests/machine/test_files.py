"""Files a user can trust: outputs written whole and never through a link, and names that cannot inject a key
into best.yaml (a folder name with newlines once wrote `learning_rate: 100` and `trust_remote_code: true`)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from autofit import cli
from autofit.core import one_line
from autofit.machine import atomic_write_text
from autofit.machine._registry import BUNDLED_DIR


def test_one_line_escapes_what_could_start_a_line():
    assert one_line("/models/evil\nlearning_rate: 100\n# ") == "/models/evil\\nlearning_rate: 100\\n# "
    assert one_line("tab\there\rcr\x1b[31m") == "tab\\there\\rcr\\x1b[31m"
    assert one_line("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


def test_atomic_write_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victims-file"
    victim.write_text("precious")
    link = tmp_path / "best.json"
    link.symlink_to(victim)
    atomic_write_text(link, '{"fits": true}\n')
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == '{"fits": true}\n'
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def safetensors_bytes(data_bytes: int) -> bytes:
    header = json.dumps({"w": {"dtype": "U8", "shape": [data_bytes], "data_offsets": [0, data_bytes]}}).encode()
    return len(header).to_bytes(8, "little") + header + b"\x01" * data_bytes


def test_a_cache_entry_is_used_while_it_is_what_was_written_and_built_again_when_not(tmp_path, caplog):
    """Issue 30, item 6: each file's size and digest in a manifest written last, and a safetensors file's length
    against its header (even where the manifest was rewritten to match the damage)."""
    from autofit.machine._files import MANIFEST, cache_entry, entry_problem

    builds = []

    def build(folder: Path) -> None:
        builds.append(folder)
        (folder / "config.json").write_text('{"layers": 2}')
        (folder / "model.safetensors").write_bytes(safetensors_bytes(64))

    entry = tmp_path / "entry"
    assert cache_entry(entry, "key-1", build) == entry and len(builds) == 1 and builds[0] != entry
    assert cache_entry(entry, "key-1", build) == entry and len(builds) == 1  # sound: used as it is
    (entry / "stray.json").write_text("{}")
    assert entry_problem(entry, "key-1") == "stray.json was added after it was written"
    assert entry_problem(entry, "key-2") == "it was built for another configuration or library version"
    (entry / "stray.json").unlink()
    with open(entry / "model.safetensors", "r+b") as handle:  # cut short, and the manifest made to agree
        handle.truncate(handle.seek(0, 2) - 16)
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["files"]["model.safetensors"]["size"] -= 16
    (entry / MANIFEST).write_text(json.dumps(manifest))
    assert "model.safetensors has " in entry_problem(entry, "key-1") and "where its header says" in \
        entry_problem(entry, "key-1")
    with caplog.at_level("WARNING"):
        cache_entry(entry, "key-1", build)
    assert len(builds) == 2 and f"the cache entry {entry} is damaged" in caplog.text
    assert entry_problem(entry, "key-1") is None
    assert (entry / "model.safetensors").read_bytes() == safetensors_bytes(64)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # nothing left beside it


def test_a_cache_entry_build_that_fails_leaves_no_entry_and_no_link_is_followed(tmp_path):
    from autofit.machine._files import cache_entry, entry_problem

    victim = tmp_path / "victims-file"
    victim.write_text("precious")
    entry = tmp_path / "cache" / "entry"
    entry.mkdir(parents=True)
    (entry / "config.json").symlink_to(victim)  # a stale entry holding a link

    def fails(folder: Path) -> None:
        (folder / "config.json").write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        cache_entry(entry, "key", fails)
    assert victim.read_text() == "precious" and entry_problem(entry, "key") is not None
    assert [p.name for p in entry.parent.iterdir() if p.name.endswith(".tmp")] == []
    for lock in entry.parent.glob(".*.lock"):  # the entry's lock, a link this time
        lock.unlink()
        lock.symlink_to(victim)
    cache_entry(entry, "key", lambda folder: (folder / "config.json").write_text("{}"))
    assert victim.read_text() == "precious" and (entry / "config.json").read_text() == "{}"
    assert not (entry / "config.json").is_symlink()


@pytest.mark.slow
def test_a_hostile_model_folder_name_cannot_add_keys_to_best_yaml(tmp_path):
    from trl import ModelConfig, SFTConfig, TrlParser

    folder = tmp_path / "models" / "evil\nlearning_rate: 100\ntrust_remote_code: true\n# "
    folder.mkdir(parents=True)
    shutil.copy(BUNDLED_DIR / "tiny-qwen2.json", folder / "config.json")
    out = tmp_path / "out"
    code = cli.main(["search", "--model", str(folder), "--device", "cpu", "--gpu-memory", "2GiB", "--max-length",
                     "16", "--effective-batch", "2", "--verify-steps", "3", "-q", "--out", str(out)])
    assert code == 0
    best = json.loads((out / "best.json").read_text())
    written = yaml.safe_load((out / "best.yaml").read_text())
    exported = {**best["config"], **best["model_args"]}
    assert set(written) <= set(exported)  # the configuration and nothing else (defaults are left out)
    assert all(written[key] == exported[key] for key in written)
    assert "learning_rate" not in written and "trust_remote_code" not in written
    assert written["model_name_or_path"] == str(folder.resolve())
    config, model = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(out / "best.yaml"), "--output_dir", str(tmp_path / "run")])
    assert config.learning_rate != 100 and config.trust_remote_code is False
    header = (out / "best.yaml").read_text().splitlines()[0]
    assert header.startswith("# autofit: best sft configuration for ") and "\\n" in header


def test_a_config_without_vocab_size_is_one_line_before_any_probe(tmp_path, capsys):
    config = json.loads((BUNDLED_DIR / "tiny-qwen2.json").read_text())
    del config["vocab_size"]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    code = cli.main(["search", "--model", str(tmp_path / "model"), "--device", "cpu", "--gpu-memory", "1GiB",
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and '"vocab_size"' in err
    assert not (tmp_path / "out" / "probes").exists()


def custom_code_model(folder: Path, marker: Path) -> Path:
    """A local model whose type transformers does not know: its auto_map points at a module of the folder, which
    leaves ``marker`` behind when it is imported (that is, when its code runs)."""
    folder.mkdir(parents=True)
    config = json.loads((BUNDLED_DIR / "tiny-qwen2.json").read_text())
    config.update(model_type="marker_lm", architectures=["MarkerForCausalLM"],
                  auto_map={"AutoConfig": "modeling_marker.MarkerConfig",
                            "AutoModelForCausalLM": "modeling_marker.MarkerForCausalLM"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_marker.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).touch()\n"
        "from transformers import Qwen2Config, Qwen2ForCausalLM\n\n\n"
        "class MarkerConfig(Qwen2Config):\n    model_type = 'marker_lm'\n\n\n"
        "class MarkerForCausalLM(Qwen2ForCausalLM):\n    config_class = MarkerConfig\n")
    return folder


def test_a_model_that_needs_its_own_code_is_refused_without_the_flag(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    folder = custom_code_model(tmp_path / "model", marker)
    for argv in (["search", "--model", str(folder), "--device", "cpu", "--gpu-memory", "1GiB", "--out",
                  str(tmp_path / "out")],
                 ["estimate", "--model", str(folder), "--device", "cpu", "--gpu-memory", "1GiB"]):
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert "'marker_lm'" in err and "--trust-remote-code" in err
    assert not marker.exists() and not (tmp_path / "out" / "probes").exists()


@pytest.mark.slow
def test_with_the_flag_the_models_code_runs_and_is_exported(tmp_path):
    from trl import ModelConfig, SFTConfig, TrlParser

    marker = tmp_path / "code-ran"
    folder = custom_code_model(tmp_path / "model", marker)
    out = tmp_path / "out"
    code = cli.main(["search", "--model", str(folder), "--device", "cpu", "--gpu-memory", "2GiB", "--max-length", "16",
                     "--effective-batch", "2", "--verify-steps", "3", "--trust-remote-code", "-q", "--out", str(out)])
    assert code == 0 and marker.exists()
    best = json.loads((out / "best.json").read_text())
    assert best["config"]["trust_remote_code"] is True  # TRL's own config field
    config, _ = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(out / "best.yaml"), "--output_dir", str(tmp_path / "run")])
    assert config.trust_remote_code is True


def test_an_out_others_can_write_to_or_with_a_linked_study_is_refused(tmp_path, capsys):
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    code = cli.main(["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "1GiB",
                     "--out", str(shared)])
    assert code == 2 and "can be written by every user" in capsys.readouterr().err
    linked = tmp_path / "linked"
    linked.mkdir()
    (tmp_path / "elsewhere.journal").write_text("")
    (linked / "study.journal").symlink_to(tmp_path / "elsewhere.journal")
    code = cli.main(["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "1GiB",
                     "--out", str(linked)])
    assert code == 2 and "study.journal is a symbolic link" in capsys.readouterr().err
    assert (tmp_path / "elsewhere.journal").read_text() == ""


def test_an_out_of_another_user_is_refused(tmp_path, capsys):
    import os

    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 4242, 4242)
    code = cli.main(["search", "--model", "tiny-qwen2", "--device", "cpu", "--gpu-memory", "1GiB",
                     "--out", str(theirs)])
    assert code == 2 and "belongs to another user" in capsys.readouterr().err


@pytest.mark.slow
def test_a_model_folder_named_with_an_emoji_is_written_in_utf8_and_loads_as_that_folder(tmp_path):
    """Issue 30, item 11: best.yaml held the folder as \\ud83d\\ude80 surrogate escapes, which YAML loads as two lone
    surrogates: `trl sft --config best.yaml` looked for a model that does not exist."""
    from trl import ModelConfig, SFTConfig, TrlParser

    folder = tmp_path / "models" / "tiny 🚀 modèle"
    folder.mkdir(parents=True)
    shutil.copy(BUNDLED_DIR / "tiny-qwen2.json", folder / "config.json")
    out = tmp_path / "out"
    code = cli.main(["search", "--model", str(folder), "--device", "cpu", "--gpu-memory", "1GiB", "--max-length",
                     "16", "--effective-batch", "2", "--verify-steps", "3", "-q", "--out", str(out)])
    assert code == 0
    raw = (out / "best.yaml").read_bytes()
    assert f'model_name_or_path: "{folder.resolve()}"'.encode() in raw  # UTF-8, as it is
    written = yaml.safe_load(raw.decode("utf-8"))
    assert written["model_name_or_path"] == str(folder.resolve())
    _, model = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(out / "best.yaml"), "--output_dir", str(tmp_path / "run")])
    assert model.model_name_or_path == str(folder.resolve()) and Path(model.model_name_or_path).is_dir()


def test_every_string_in_best_yaml_loads_back_as_itself():
    """best.yaml's strings, whatever they hold: one line, UTF-8, and YAML reads back the same text (an emoji was two
    lone surrogates; NEL, U+2028 and DEL are line breaks or refused as they are)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from autofit.export._write import _scalar

    @settings(max_examples=300, deadline=None)
    @given(st.text())
    def loads_back(text):
        line = f"key: {_scalar(text)}  # a comment"
        assert len(line.splitlines()) == 1 and yaml.safe_load(line.encode("utf-8")) == {"key": text}

    loads_back()
    assert _scalar("/models/tiny 🚀\u2028\x7f") == '"/models/tiny 🚀\\U00002028\\U0000007f"'


def test_one_line_escapes_what_would_show_as_other_text():
    from autofit.core import one_line

    # a name a store's writer chose: U+202E shows the rest reversed, a lone surrogate cannot be printed at all (the
    # worker's log line died on it); emoji and accents stay as they are
    assert one_line("trial of autofit-probes:\u202eevil\ud800 \u0085x é 🚀") == \
        "trial of autofit-probes:\\u202eevil\\ud800 \\x85x é 🚀"
