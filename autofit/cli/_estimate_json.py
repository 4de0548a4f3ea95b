"""``autofit estimate --json``: the estimate as one JSON document, for scripts and notebooks. It is built from the
same ``CardEstimate`` objects the text is printed from (``_estimate_facts``), so every level and figure the text
prints is here with the same number. Sizes are ``{"bytes": int, "gib": float}``; the keys are documented in
docs/cli.md ("`autofit estimate --json`") and stay stable: a new key may be added, none is renamed or removed
without a new ``schema``."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

from autofit.cli._answer import alternatives, choose, walked, why
from autofit.cli._estimate_facts import CardEstimate, parameters_line, phase_label
from autofit.cli._exit import EXIT_BAD_INPUT, EXIT_OK, exit_block
from autofit.cli._speed import estimate_card
from autofit.core import RL_ALGOS, Candidate
from autofit.memory_model import (
    PRIOR_SPEED_UNCERTAINTY,
    TERMS,
    Ledger,
    SpeedEstimate,
    host_figures,
    prior_uncertainty,
)
from autofit.rungs import replacement_trade

SCHEMA = 1
GiB = 2**30
# A candidate's fields that are the question's, not the level's configuration (the same at every level).
QUESTION_FIELDS = ("algo", "model", "device", "user_args", "real_weights", "trust_remote_code", "rungs")
OUTSIDE = ("allocator", "cuda_context")  # not tensors: what nvidia-smi shows beyond PyTorch's allocated peak


def size(value: float) -> Dict[str, Any]:
    """A size as the document gives every size: whole bytes, and GiB rounded to 4 places."""
    return {"bytes": int(round(value)), "gib": round(value / GiB, 4)}


def estimate_json(estimates: Sequence[CardEstimate]) -> str:
    """The whole estimate: one entry per card of ``--gpu-memory``, and their comparison when there are several."""
    document = {"schema": SCHEMA, "command": "estimate", "exit": exit_block(EXIT_OK, command="estimate"),
                "estimates": [card_document(facts) for facts in estimates],
                "comparison": comparison(estimates) if len(estimates) > 1 else None}
    return json.dumps(document, indent=2, default=str, allow_nan=False)


def refused_json(line: str) -> str:
    """An estimate refused (exit 2): the one line printed on stderr, in the ``exit`` block; no estimate."""
    document = {"schema": SCHEMA, "command": "estimate", "exit": exit_block(EXIT_BAD_INPUT, line, "estimate"),
                "estimates": [], "comparison": None}
    return json.dumps(document, indent=2)


def card_document(facts: CardEstimate) -> Dict[str, Any]:
    spec, result, budget = facts.spec, facts.result, facts.budget
    options = spec.options
    census = facts.shape.parameters().for_algo(options.algo)
    rl = options.algo in RL_ALGOS
    expected = result.expected
    return {
        "card": facts.card,
        "question": {
            "algo": options.algo, "model": options.model, "device": spec.device, "config": options.config,
            "gpu_memory": size(spec.gpu_bytes or budget), "budget": size(budget), "gpus": spec.ranks,
            "effective_batch": options.effective_batch,
            "length_field": "max_completion_length" if rl else "max_length", "length": spec.max_length,
            "prompt_length": options.max_prompt_length if rl else None,
        },
        "memory_model": {
            "calibrated": facts.calibration is not None,
            "uncertainty": (facts.calibration.uncertainty if facts.calibration is not None
                            else prior_uncertainty(facts.shape, options.algo)),
            "parameters": census.total, "parameters_line": parameters_line(facts.shape, options.algo),
            "unchecked": facts.unchecked,
        },
        "notes": facts.all_notes(),
        "rungs_left_out": list(facts.left_out),
        "vllm": list(facts.vllm),
        "your_run": _your_run(facts),
        "levels": [_level(level, facts.result.levels[index - 1] if index else None, budget,
                          facts.speeds[index] if facts.speeds else None)
                   for index, level in enumerate(result.levels)],
        "speed": _speed(facts),
        "answer": _answer(facts),
        "expected": None if expected is None else {
            **_level(expected, None, budget, None), "rung": result.rung, "dropped": list(result.dropped)},
        "lightest": None if expected is not None else _level(
            min(result.levels, key=lambda level: level.ledger.total), None, budget, None),
        "plot": facts.plot,
    }


def _answer(facts: CardEstimate) -> Optional[Dict[str, Any]]:
    """The level the text's "use:" line names (what a search is expected to write), why, and the alternatives it
    names, each as a level number."""
    group = walked(facts)
    pick = choose(facts, group)
    if pick is None:
        return None
    shown = facts.result.levels[pick.level.level]
    return {**_level(pick.level, None, facts.budget, pick.speed),
            "without": [name for name in shown.rungs if name not in pick.level.rungs],
            "why": why(facts, pick, group),
            "alternatives": [{"label": label, "level": other.level.level}
                             for label, other in alternatives(facts, pick)]}


def _configuration(candidate: Candidate) -> Dict[str, Any]:
    data = {key: value for key, value in candidate.to_dict().items() if key not in QUESTION_FIELDS}
    return {"describe": candidate.describe(), **data}


def _figures(ledger: Ledger, budget: int) -> Dict[str, Any]:
    """A ledger's point prediction: its terms, PyTorch's allocated peak and nvidia-smi's figure, band and verdict."""
    return {
        "phase": ledger.phase,
        "terms": {term: size(getattr(ledger, term)) for term in TERMS},
        "pytorch": size(ledger.allocated),
        "nvidia_smi": size(ledger.total),
        "peak": size(ledger.total),
        "band": size(ledger.total * ledger.uncertainty),
        "uncertainty": ledger.uncertainty,
        "fits": ledger.fits(budget),
        "verdict": ledger.verdict(budget),
        "refused": ledger.refused or None,  # why it cannot run on any budget (a colocated vLLM that does not start)
        "host": size(ledger.host),
        "phase_totals": {name: size(total) for name, total in ledger.phase_totals.items()},
    }


def _level(level: Any, before: Any, budget: int, speed: Optional[SpeedEstimate]) -> Dict[str, Any]:
    leaves_out = [name for name in (before.rungs if before is not None else ()) if name not in level.rungs]
    return {
        "level": level.level, "rungs": list(level.rungs), "adds": level.rungs[-1] if level.rungs else None,
        "leaves_out": leaves_out, "cost": level.cost, "configuration": _configuration(level.candidate),
        **_figures(level.ledger, budget),
        "speed": _speed_of(speed),
        "trade": replacement_trade(level.candidate),  # an engine of autofit's that replaces the launch's, in words
    }


def _speed_of(speed: Optional[SpeedEstimate]) -> Optional[Dict[str, Any]]:
    if speed is None:
        return None
    return {"tokens_per_second": speed.tokens_per_second, "tokens_per_second_per_gpu": speed.tokens_per_second_per_gpu,
            "seconds_per_step": speed.seconds_per_step, "uncertainty": speed.uncertainty,
            "seconds_by_part": dict(speed.terms), "notes": list(speed.notes)}


def _your_run(facts: CardEstimate) -> Optional[Dict[str, Any]]:
    """The user's run (``--config``): level 0 at its peak, and each phase of its step by term."""
    if facts.spec.baseline is None:
        return None
    level = facts.result.levels[0]
    peak = max(facts.run_phases, key=lambda ledger: ledger.total).phase if facts.run_phases else None
    return {
        "config": facts.spec.options.config,
        "configuration": _configuration(level.candidate),
        **_figures(level.ledger, facts.budget),
        "speed": _speed_of(facts.speeds[0] if facts.speeds else None),
        "phases": [{"phase": ledger.phase, "label": phase_label(ledger.phase), "peak": ledger.phase == peak,
                    "terms": {term: size(getattr(ledger, term)) for term in TERMS if term not in OUTSIDE},
                    "pytorch": size(ledger.allocated), "allocator": size(ledger.allocator),
                    "cuda_context": size(ledger.cuda_context), "nvidia_smi": size(ledger.total)}
                   for ledger in facts.run_phases],
    }


def _speed(facts: CardEstimate) -> Optional[Dict[str, Any]]:
    """The named card's peaks, and the fastest levels predicted to fit (None: no card named)."""
    card = estimate_card(facts.spec)
    if card is None or facts.speeds is None:
        return None
    fitting = facts.fastest_fits()
    return {
        "card": card.name, "source": card.source, "flops": card.flops, "bandwidth": card.bandwidth,
        "uncertainty": facts.speeds[0].uncertainty if facts.speeds else PRIOR_SPEED_UNCERTAINTY,
        "fastest": [{"level": level.level, **(_speed_of(speed) or {})} for speed, level in fitting[:2]],
        "host": host_figures(card, facts.spec.ranks),  # what a level that offloads its optimizer is priced at
    }


def comparison(estimates: Sequence[CardEstimate]) -> List[Dict[str, Any]]:
    """Where the run fits on each card and how fast (``--gpu-memory H100,L4``): the same rows the text's table has."""
    rows = []
    for facts in estimates:
        expected = facts.result.expected
        fitting = facts.fastest_fits()
        rows.append({
            "card": facts.card, "budget": size(facts.budget),
            "expected_level": expected.level if expected else None,
            "expected_peak": size(expected.ledger.total) if expected else None,
            "fastest_level": fitting[0][1].level if fitting else None,
            "tokens_per_second": fitting[0][0].tokens_per_second if fitting else None,
        })
    return rows
