"""The algorithm contract, held by every algorithm of the registry (autofit.core._algorithms): its factory exists,
its config class (where the installed TRL has it) has the fields its entry says it has, its trl command is TRL's, and
the ledger computes the phases and models it declares."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from autofit import memory_model as mm
from autofit.core import ALGORITHMS, PRECOMPUTE, Candidate
from autofit.launch import trl_command_names

KNOWN_PHASES = {"train", "backward", "step", "generation", "scoring", "precompute"}
KNOWN_MODELS = {"policy", "reference", "reward", "value"}


@pytest.fixture(params=sorted(ALGORITHMS), ids=str)
def unit(request):
    return ALGORITHMS[request.param]


def _resolve(path: str):
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def test_its_factory_exists(unit):
    assert callable(_resolve(unit.factory))


def test_its_config_class_has_the_fields_its_entry_names(unit):
    if unit.available() is not None:
        pytest.skip(unit.available())
    fields = {f.name for f in dataclasses.fields(_resolve(unit.config_class))}
    named = [unit.length_field, "per_device_train_batch_size", "gradient_accumulation_steps"]
    named += ["beta"] if unit.has_beta else []
    named += [unit.kl_field] if unit.kl_field else []
    named += ["num_generations"] if unit.groups else []
    named += ["activation_offloading"] if unit.activation_offloading else []
    named += ["use_liger_kernel"] if unit.liger else []
    named += ["model_init_kwargs"] if unit.model_init_kwargs else []
    assert set(named) <= fields, set(named) - fields


def test_its_trl_command_is_trls(unit):
    assert unit.trl_command is None or unit.trl_command in trl_command_names()


def test_the_ledger_computes_the_phases_and_models_it_declares(unit):
    assert set(unit.phases) <= KNOWN_PHASES and set(unit.models) <= KNOWN_MODELS
    if not unit.estimated:
        return
    candidate = Candidate(unit.name, "tiny-qwen2", "cuda", micro_batch=4, grad_accum=1, max_length=64,
                          prompt_length=16 if unit.rl else None, num_generations=2 if unit.groups else None,
                          user_args=(("beta", 0.1),) if unit.has_beta else ())
    ledgers = mm.phase_ledgers(candidate)
    assert {ledger.phase for ledger in ledgers} == set(unit.phases) - {PRECOMPUTE}  # a pass before training: optional
    if unit.precompute_ref:  # the reference's log-probs precomputed: the pass before training, no reference model
        precomputed = mm.phase_ledgers(candidate.replace(precompute_ref=True))
        assert PRECOMPUTE in {ledger.phase for ledger in precomputed}
        assert max(ledger.reference for ledger in precomputed) == 0
    with_reference = max(ledgers, key=lambda ledger: ledger.total).reference
    # the reference model: where the unit holds one, at a KL coefficient above 0 (PPO's kl_coef is never 0 by default)
    assert (with_reference > 0) == ("reference" in unit.models and (unit.has_beta or unit.kl_field is not None))
