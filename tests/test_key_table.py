"""Every field of the installed TRL's config classes (and transformers' TrainingArguments under them, ModelConfig,
the scripts' arguments) is classified by autofit's key table: a field a new TRL adds fails here, on the main lane
and on the floor lane, before it can be dropped in silence."""

import dataclasses
import importlib

import pytest

from autofit.core._key_table import KINDS, TABLE, classify, markdown, unclassified

ALGOS = ("sft", "grpo", "rloo", "reward")


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

    page = Path(__file__).resolve().parents[1] / "docs" / "keys.md"
    assert page.read_text() == markdown(), "regenerate: python -m autofit.core._key_table > docs/keys.md"
