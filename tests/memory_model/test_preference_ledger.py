"""Issue 47: the ledger computes DPO's and KTO's phases from their units' declarations (autofit.core._algorithms): the
models a unit holds (a reference, unless LoRA or precomputed log-probs make it unneeded), the sequences per example
(DPO's chosen and rejected sides in one forward), the precompute pass it declares; no ledger module names them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from autofit import memory_model as mm
from autofit.core import ALGORITHMS, PRECOMPUTE, Candidate, LoraSettings

DPO = Candidate("dpo", "Qwen/Qwen2.5-0.5B", "cuda", micro_batch=4, grad_accum=1, max_length=1024)


def _peak(candidate: Candidate, phase: str = "train") -> mm.Ledger:
    return next(ledger for ledger in mm.phase_ledgers(candidate) if ledger.phase == phase)


def test_the_reference_model_is_the_units_to_hold():
    weights = _peak(DPO, "step").weights  # the policy's (the train phase adds autocast's bf16 copy)
    assert _peak(DPO).reference == pytest.approx(weights)  # a copy of the policy, in its dtype
    assert _peak(DPO.replace(precompute_ref=True)).reference == 0  # its log-probs precomputed: never loaded
    assert _peak(DPO.replace(lora=LoraSettings())).reference == 0  # the policy with its adapter off
    assert _peak(DPO.replace(user_args=(("beta", 0.0),))).reference == 0
    assert _peak(DPO.replace(algo="kto")).reference == pytest.approx(weights)


def test_a_unit_without_a_reference_holds_none(monkeypatch):
    monkeypatch.setitem(ALGORITHMS, "dpo", dataclasses.replace(ALGORITHMS["dpo"], models=("policy",)))
    assert _peak(DPO).reference == 0


def test_dpos_two_sides_are_one_forward_of_twice_the_rows():
    dpo, kto = _peak(DPO), _peak(DPO.replace(algo="kto", micro_batch=2 * DPO.micro_batch))
    assert dpo.activations == pytest.approx(kto.activations, rel=1e-6)
    assert dpo.logits == pytest.approx(kto.logits, rel=1e-6)
    assert _peak(DPO).activations > _peak(DPO.replace(algo="kto")).activations


def test_the_precompute_pass_is_a_phase_where_the_unit_declares_it():
    assert PRECOMPUTE in ALGORITHMS["dpo"].phases
    assert PRECOMPUTE not in {ledger.phase for ledger in mm.phase_ledgers(DPO)}
    precomputed = _peak(DPO.replace(precompute_ref=True), PRECOMPUTE)
    assert precomputed.optimizer == 0 and precomputed.gradients == 0 and precomputed.logits > 0
    sft = Candidate("sft", "Qwen/Qwen2.5-0.5B", "cuda", micro_batch=4, grad_accum=1, max_length=1024,
                    precompute_ref=True)
    assert PRECOMPUTE not in {ledger.phase for ledger in mm.phase_ledgers(sft)}  # SFT declares no such pass


def test_no_module_of_the_memory_model_names_a_preference_trainer():
    package = Path(mm.__file__).parent
    named = [path.name for path in package.glob("*.py") if re.search(r"[\"'](dpo|kto)[\"']", path.read_text())]
    assert named == []
