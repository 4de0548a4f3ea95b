"""The knob contract (issue 58, item 2), held by every knob of the table (``autofit.core._knob_table``): its fields are
the candidate's, its keys are TRL's (a field of a config class TRL's parser fills, or the parser's own ``env``), and
what it writes for a candidate is keys of the table, a model key among ModelConfig's; nothing named here."""

from __future__ import annotations

import dataclasses

import pytest

from autofit.core import Candidate
from autofit.core._knob_table import KNOBS
from tests.core.test_knobs import GRPO, SFT

# TrlParser's own top-level key: the environment it sets before parsing [V code: trl 1.16 scripts/utils.py]
PARSER_KEYS = {"env"}
ALL_KEYS = {key for k in KNOBS for key in k.keys}


def _fields(*classes) -> set:
    return {f.name for c in classes for f in dataclasses.fields(c)}


@pytest.fixture(scope="module")
def trl_keys():
    """Every field of the config classes TRL's command line parses: the training arguments of each trainer (and
    transformers' base), ModelConfig and ScriptArguments."""
    import transformers
    import trl

    configs = [getattr(trl, name) for name in dir(trl) if name.endswith("Config")]
    classes = [c for c in configs if isinstance(c, type) and dataclasses.is_dataclass(c)]
    return {"training": _fields(transformers.TrainingArguments, trl.ScriptArguments, *classes) | PARSER_KEYS,
            "model": _fields(trl.ModelConfig)}


@pytest.fixture(params=[k.name for k in KNOBS], ids=str)
def knob(request):
    return next(k for k in KNOBS if k.name == request.param)


def test_its_fields_are_the_candidates_and_its_keys_trls(knob, trl_keys):
    assert knob.name and set(knob.fields) <= {f.name for f in dataclasses.fields(Candidate)}
    unknown = set(knob.training_keys) - trl_keys["training"]
    # a key of a newer transformers (``activation_checkpointing``) is read beside the spelling the installed one has
    assert not unknown or len(unknown) < len(knob.training_keys), unknown
    assert set(knob.model_keys) <= trl_keys["model"], set(knob.model_keys) - trl_keys["model"]
    assert set(knob.reads) <= set(knob.keys) and set(knob.option_keys.values()) <= set(knob.keys)


@pytest.mark.parametrize("candidate", [SFT, GRPO], ids=["sft", "grpo"])
def test_what_it_writes_is_keys_of_the_table(knob, candidate):
    written, model = knob.training(candidate), knob.model(candidate, {})
    assert isinstance(written, dict) and set(written) <= ALL_KEYS, set(written) - ALL_KEYS
    assert isinstance(model, dict) and set(model) <= set().union(*(k.model_keys for k in KNOBS))
    for key in knob.keys:  # its comment in best.yaml, where it has one, is words
        said = knob.said_after(key, candidate) if knob.said_after else None
        assert said is None or (isinstance(said, str) and said)
