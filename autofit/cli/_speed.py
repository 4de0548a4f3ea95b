"""The estimate's speed: predicted tokens per second of each level on the named card, and the fastest configuration
predicted to fit with what it trades against the next (``autofit.memory_model``'s throughput model)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from autofit.core import SearchSpec
from autofit.memory_model import (
    PRIOR_SPEED_UNCERTAINTY,
    Card,
    ModelShape,
    SpeedEstimate,
    card_named,
    predict_speed,
)
from autofit.rungs import rung_named


def estimate_card(spec: SearchSpec) -> Optional[Card]:
    """The card whose peaks the speed is predicted on: the one ``--gpu-memory`` names (H100, L4, ...); None for a
    size, or the CPU."""
    given = spec.options.gpu_memory
    return card_named(given) if spec.device == "cuda" and isinstance(given, str) else None


def level_speeds(spec: SearchSpec, shape: ModelShape, levels: Sequence[Any]) -> Optional[List[SpeedEstimate]]:
    """Each level's predicted speed, in order; None where no card is named."""
    card = estimate_card(spec)
    if card is None:
        return None
    return [predict_speed(level.candidate, shape, card) for level in levels]


def speed_cell(speed: SpeedEstimate) -> str:
    return f"{speed.tokens_per_second:,.0f}"


def speed_lines(spec: SearchSpec, levels: Sequence[Any], speeds: Optional[List[SpeedEstimate]]) -> List[str]:
    """The fastest level predicted to fit, and the trade against the next fastest; or how to get a speed."""
    budget = spec.budget_bytes
    if speeds is None:
        if spec.device == "cuda":
            return ["speed: name a card (--gpu-memory H100, L4, A100-80GB, ...) for tokens/s from its published peaks"]
        return []
    card = estimate_card(spec)
    assert card is not None and budget is not None  # speeds come with a card; an estimate has a budget
    fitting = sorted(((s, level) for s, level in zip(speeds, levels, strict=True) if level.ledger.fits(budget)),
                     key=lambda pair: -pair[0].tokens_per_second)
    lines = [f"speed on one {card.name} ({card.source}: {card.flops / 1e12:,.0f} TFLOP/s, "
             f"{card.bandwidth / 1e12:.2f} TB/s): tok/s predicted ± {speeds[0].uncertainty:.0%}, uncalibrated"]
    if not fitting:
        return lines
    best, level = fitting[0]
    slowest = max(best.terms.items(), key=lambda item: item[1])
    lines.append(f"fastest predicted fit: level {level.level} ({'+'.join(level.rungs) or 'baseline'}), "
                 f"{level.candidate.describe()}: {speed_cell(best)} tok/s, {best.seconds_per_step:.2f} s per optimizer "
                 f"step (most of it {slowest[0]})")
    if len(fitting) > 1:
        second, other = fitting[1]
        lines.append(f"  next: level {other.level} ({'+'.join(other.rungs) or 'baseline'}) at "
                     f"{speed_cell(second)} tok/s, {1 - second.tokens_per_second / best.tokens_per_second:.0%} slower"
                     + _trade(level, other))
    return lines


def _trade(faster: Any, slower: Any) -> str:
    """What the faster level trades that the slower does not: its own rungs' sentences."""
    extra = [name for name in faster.rungs if name not in slower.rungs]
    sentences = []
    for name in extra:
        rung = rung_named(name)
        trade = getattr(rung, "trade", None)
        sentence = trade(faster.candidate, {}) if trade is not None else None
        if sentence:
            sentences.append(sentence)
    return ("; the faster trades " + "; ".join(sentences)) if sentences else ""


def comparison_lines(compared: Sequence[Any]) -> List[str]:
    """Where one run fits and how fast, card by card (``--gpu-memory H100,L4``): each card's expected level and the
    fastest level predicted to fit it. ``compared``: (card as given, its question, its levels' estimate)."""
    from autofit.core import format_size

    rows = [("card", "budget", "expected level", "its peak", "fastest fit", "tok/s")]
    for card, spec, result in compared:
        expected = result.expected
        levels = result.levels
        shape = ModelShape.from_model(spec.options.model)
        speeds = level_speeds(spec, shape, levels)
        fitting = [(s, level) for s, level in zip(speeds or [], levels, strict=False) if level.ledger.fits(
            spec.budget_bytes)]
        fastest = max(fitting, key=lambda pair: pair[0].tokens_per_second) if fitting else None
        rows.append((card, format_size(spec.budget_bytes),
                     f"{expected.level} ({'+'.join(expected.rungs[-1:]) or 'baseline'})" if expected else "none fits",
                     format_size(expected.ledger.total) if expected else "-",
                     f"{fastest[1].level} ({'+'.join(fastest[1].rungs[-1:]) or 'baseline'})" if fastest else "-",
                     speed_cell(fastest[0]) if fastest else "-" if speeds else "no card named"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["cards compared (the same run on each; tok/s of the fastest level predicted to fit, ± "
             f"{PRIOR_SPEED_UNCERTAINTY:.0%}):"]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return lines
