"""The card contract, held by every card autofit knows (autofit.core._cards, each declared once): its memory is what
``--gpu-memory CARD`` plans for, its published rates price a step, and its source is named."""

from __future__ import annotations

import math

import pytest

from autofit import memory_model as mm
from autofit.core import CARDS, Candidate, card_named, parse_size


@pytest.fixture(params=sorted(CARDS), ids=str)
def card(request):
    return CARDS[request.param]


def test_its_name_plans_for_its_memory(card):
    assert card.memory_mib > 0 and parse_size(card.name) == card.memory_mib * 2**20
    assert card_named(card.name.lower()) is card


def test_its_rates_are_published_and_price_a_step(card):
    assert min(card.flops, card.bandwidth, card.host_link, card.gpu_link) > 0 and card.source
    candidate = Candidate("sft", "Qwen/Qwen2.5-0.5B", "cuda", micro_batch=4, grad_accum=1, max_length=512)
    speed = mm.predict_speed(candidate, mm.ModelShape.from_model(candidate.model), card)
    assert math.isfinite(speed.tokens_per_second) and speed.tokens_per_second > 0
