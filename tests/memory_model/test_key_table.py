"""Every field of the installed TRL's config classes (and transformers' TrainingArguments under them, ModelConfig,
the scripts' arguments) is classified by autofit's key table: a field a new TRL adds fails here, on the main lane
and on the floor lane, before it can be dropped in silence."""

import dataclasses
import importlib

import pytest

from autofit.launch._keys_page import page
from autofit.memory_model._key_table import KINDS, TABLE, classify, markdown, unclassified

ALGOS = ("sft", "grpo", "rloo", "reward", "dpo", "kto")


def script_fields(algo, extra=()):
    """The field names of every dataclass the ``trl <algo>`` command parses a config file into."""
    module = importlib.import_module(f"trl.scripts.{algo}")
    types = list(module.make_parser().dataclass_types) + list(extra)
    return {item.name for kind in types for item in dataclasses.fields(kind)}


@pytest.mark.parametrize("algo", ALGOS)
def test_every_field_of_the_installed_trl_is_classified(algo):
    assert unclassified(script_fields(algo)) == []


def test_a_field_added_to_trls_config_class_is_caught():
    from trl import SFTConfig

    @dataclasses.dataclass
    class NewerSFTConfig(SFTConfig):
        fused_everything: bool = False

    assert unclassified(script_fields("sft", extra=(NewerSFTConfig,))) == ["fused_everything"]
    assert classify("fused_everything") is None


def test_the_table_says_what_and_why():
    assert {kind for kind, _ in TABLE.values()} == set(KINDS)
    for key, (kind, why) in TABLE.items():
        assert kind == "no-memory" or why, key  # every key that matters says why
    assert classify("lora_modules_to_save")[0] == "modelled"  # issue 39 item 2: probed as written and counted
    assert classify("model_revision")[0] == "probed"
    assert classify("output_dir")[0] == "not-probed"
    assert "| `per_device_train_batch_size` | modelled |" in markdown()


def test_the_docs_page_is_the_table():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "keys.md"
    assert path.read_text() == page(), "regenerate: python -m autofit.launch._keys_page > docs/keys.md"


# Issue 39, item 3: accelerate's config keys are classified as a TRL file's are.
def accelerate_sections():
    """Every key the installed accelerate writes or takes in a config file: ClusterConfig's fields (the top level),
    and the FSDP and DeepSpeed plugins' keys (``accelerate config``'s and ``accelerate launch``'s options)."""
    import inspect
    import re

    from accelerate.commands.config import cluster
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    source = inspect.getsource(cluster)
    plugins = {"fsdp_config": set(re.findall(r'fsdp_config\["(\w+)"\]', source)),
               "deepspeed_config": set(re.findall(r'deepspeed_config\["(\w+)"\]', source))}
    for group in launch_command_parser()._action_groups:
        for title, section in (("FSDP", "fsdp_config"), ("DeepSpeed", "deepspeed_config")):
            if group.title and group.title.startswith(title):
                plugins[section] |= {action.dest for action in group._group_actions}
    return {"": {item.name for item in dataclasses.fields(ClusterConfig)}, **plugins}


def test_every_key_of_the_installed_accelerate_is_classified():
    from autofit.launch._accelerate_keys import unclassified_accelerate

    sections = accelerate_sections()
    assert len(sections[""]) > 20 and len(sections["fsdp_config"]) > 10 and len(sections["deepspeed_config"]) > 10
    for section, keys in sections.items():
        assert unclassified_accelerate(keys, section) == [], section


def test_every_key_of_trls_accelerate_configs_is_classified():
    from pathlib import Path

    import yaml

    from autofit.launch._accelerate_keys import unclassified_accelerate

    folder = Path(importlib.import_module("trl").__file__).parent / "accelerate_configs"
    files = sorted(folder.glob("*.yaml"))
    assert files, "this TRL ships accelerate configs"
    for path in files:
        values = yaml.safe_load(path.read_text())
        assert unclassified_accelerate(values) == [], path.name
        for section in ("fsdp_config", "deepspeed_config"):
            assert unclassified_accelerate(values.get(section) or {}, section) == [], path.name


def test_a_key_added_to_accelerates_cluster_config_is_caught():
    from accelerate.commands.config.config_args import ClusterConfig

    from autofit.launch._accelerate_keys import unclassified_accelerate

    @dataclasses.dataclass
    class NewerClusterConfig(ClusterConfig):
        pipeline_config: dict = None

    assert unclassified_accelerate({f.name for f in dataclasses.fields(NewerClusterConfig)}) == ["pipeline_config"]


def test_an_accelerate_feature_the_ledger_leaves_out_is_named_and_widens_the_band(tmp_path):
    from pathlib import Path

    from autofit.launch import launch_engine, read_accelerate_config

    trl_fsdp2 = Path(importlib.import_module("trl").__file__).parent / "accelerate_configs" / "fsdp2.yaml"
    plain = launch_engine({}, {}, {}, door_file=read_accelerate_config(str(trl_fsdp2)))
    assert plain.sharding == "fsdp2" and not plain.notes  # TRL's own fsdp2: every key modelled or memory-free

    path = tmp_path / "fsdp.yaml"
    path.write_text(trl_fsdp2.read_text() + "dynamo_config:\n  dynamo_backend: INDUCTOR\nfp8_config:\n"
                    "  backend: TE\nsome_new_key: 3\n")
    engine = launch_engine({}, {}, {}, door_file=read_accelerate_config(str(path)))
    assert engine.sharding == "fsdp2"
    said = " | ".join(engine.notes)
    assert "torch.compile by accelerate" in said and "dynamo_config" in said
    assert "fp8 training" in said
    assert "some_new_key: 3" in said and "does not know" in said
    off = tmp_path / "off.yaml"
    off.write_text(trl_fsdp2.read_text() + "dynamo_config:\n  dynamo_backend: 'NO'\n")
    assert not launch_engine({}, {}, {}, door_file=read_accelerate_config(str(off))).notes
