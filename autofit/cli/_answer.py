"""The estimate's answer, first: the level to use and why, by the rule the search chooses by, then the alternatives
with their trade. A search walks the ladder until a cost class has a fit, compares the fits of that class (free and
speed rungs: the fastest by timing, here by the throughput model; quality rungs: the first that fits; ``--maximize
length``: the longest length), and stops at a fit that reaches the level's top (``autofit.search._walk``,
``_choice``); the estimate applies the same rule to predictions, so "use" names what a search is expected to write."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from autofit.cli._estimate_facts import CardEstimate
from autofit.cli._speed import PREDICTED_TIE, level_speeds, speed_cell
from autofit.core import format_size
from autofit.memory_model import LevelEstimate, SpeedEstimate
from autofit.rungs import FREE, QUALITY, SPEED, rung_named

# What each cost class keeps of the run as asked: an alternative's trade where its rungs say none of their own.
CLASS_WORDS = {FREE: "the same training", SPEED: "the same training, slower",
               QUALITY: "a different training: LoRA, quantization, 8-bit states, bf16 weights or shorter sequences"}
TRADES_SAID = 2  # an alternative's quality rungs whose sentences are written out; the rest by name


@dataclass(frozen=True)
class Pick:
    level: LevelEstimate
    speed: Optional[SpeedEstimate]
    klass: str
    top: bool = False  # the table's level fits at its top: the walk compares no later level


def _class(facts: CardEstimate, level: LevelEstimate) -> str:
    return SPEED if facts.spec.options.maximize == "length" and level.cost == FREE else level.cost


def _speed(facts: CardEstimate, level: LevelEstimate) -> Optional[SpeedEstimate]:
    return facts.speeds[level.level] if facts.speeds else None


def walked(facts: CardEstimate, usable=lambda level: True) -> List[Pick]:
    """The fits a search's walk compares, in ladder order: from the first level predicted to fit, the levels of its
    cost class up to the first fit at its level's top (one level only for a quality rung)."""
    budget, group = facts.budget, []  # type: Tuple[int, List[Pick]]
    expected, dropped = facts.result.expected, facts.result.dropped
    klass: Optional[str] = None
    for level in facts.result.levels:
        if not usable(level):
            continue
        if klass is not None and (_class(facts, level) != klass or klass == QUALITY or any(p.top for p in group)):
            break
        if level.ledger.fits(budget):
            klass = klass or _class(facts, level)
            if dropped and expected is not None and expected.level == level.level and usable(expected):
                # the search tries the first fit without the rungs it is predicted not to need
                speeds = level_speeds(facts.spec, facts.shape, [expected])
                group.append(Pick(expected, speeds[0] if speeds else None, klass, level.top))
            else:
                group.append(Pick(level, _speed(facts, level), klass, level.top))
    return group


def choose(facts: CardEstimate, group: Sequence[Pick]) -> Optional[Pick]:
    """The fit a search would write among ``group``: the longest length with ``--maximize length``, else in a free
    or speed class the fastest predicted (within ``PREDICTED_TIE`` of it, the fewest trades), else the first."""
    if not group:
        return None
    if facts.spec.options.maximize == "length":
        longest = max(p.level.candidate.max_length for p in group)
        group = [p for p in group if p.level.candidate.max_length == longest]
    if group[0].klass == QUALITY or any(p.speed is None for p in group):
        return group[0]
    top = max(p.speed.tokens_per_second for p in group if p.speed is not None)
    return min((p for p in group if p.speed is not None and p.speed.tokens_per_second >= (1 - PREDICTED_TIE) * top),
               key=lambda p: p.level.level)


def _name(level: LevelEstimate) -> str:
    return f"level {level.level} ({'+' + level.rungs[-1] if level.rungs else 'baseline'})"


def _dropped(facts: CardEstimate, pick: Pick) -> str:
    """The rungs of the table's level the answer goes without (the search's pruning)."""
    shown = facts.result.levels[pick.level.level]
    gone = [name for name in shown.rungs if name not in pick.level.rungs]
    return f" without {', '.join(gone)}" if gone else ""


def _figures(facts: CardEstimate, pick: Pick) -> str:
    ledger = pick.level.ledger
    speed = f", {speed_cell(pick.speed)} tok/s" if pick.speed is not None else ""
    host = f", {format_size(ledger.host)} of host RAM pinned" if ledger.host else ""
    return f"{pick.level.candidate.describe()}: {format_size(ledger.total)} of {format_size(facts.budget)}{speed}{host}"


def _trade(facts: CardEstimate, other: Pick, answer: Pick) -> str:
    """What ``other`` changes of the training that the answer (as the table's level has it) does not: its quality
    rungs' own sentences, the first ``TRADES_SAID`` written out; its cost class's words where it has none."""
    theirs = set(answer.level.rungs) | set(facts.result.levels[answer.level.level].rungs)
    extra = [name for name in other.level.rungs if name not in theirs]
    said: List[str] = []
    more: List[str] = []
    for name in extra:
        rung = rung_named(name)
        if rung is None or getattr(rung, "cost", None) != QUALITY:
            continue
        trade = getattr(rung, "trade", None)
        sentence = trade(other.level.candidate, {}) if trade is not None else None
        if not sentence and getattr(rung, "trade_text", None):
            continue  # a trade it has, not in this candidate: a later rung replaced it (quant-8bit under quant-4bit)
        if sentence and len(said) < TRADES_SAID:
            said.append(sentence)
        else:
            more.append(name)
    if more:
        said.append("and " + ", ".join(more))
    return "; ".join(said) or CLASS_WORDS[other.klass]


def why(facts: CardEstimate, pick: Pick, group: Sequence[Pick]) -> str:
    first = group[0].level.level
    over = f"; levels 0-{first - 1} are over the budget" if first > 1 else "; level 0 is over the budget" \
        if first == 1 else ""
    if facts.spec.options.maximize == "length":
        rule = f"the longest length predicted to fit, {pick.level.candidate.max_length:,} tokens"
    elif pick.klass == QUALITY:
        rule = ("the first level that fits; no level that keeps the training as asked does, and each rung after it "
                "changes the training more")
    elif pick.speed is not None and len(group) > 1:
        rule = f"the fastest predicted of the {len(group)} levels that fit with the training as asked"
    else:
        rule = "the first level that fits with the training as asked"
    return rule + over


def alternatives(facts: CardEstimate, pick: Pick) -> List[Tuple[str, Pick]]:
    """Other fits worth naming: the fastest predicted (within ``PREDICTED_TIE``, the fewest trades) and the lightest,
    each where it is not the answer."""
    fits = [Pick(level, _speed(facts, level), _class(facts, level)) for level in facts.result.levels
            if level.ledger.fits(facts.budget) and level.level != pick.level.level]
    named: List[Tuple[str, Pick]] = []
    timed = [p for p in fits if p.speed is not None]
    if timed and pick.speed is not None:
        top = max(p.speed.tokens_per_second for p in timed if p.speed is not None)
        fastest = min((p for p in timed if p.speed is not None and p.speed.tokens_per_second >= (1 - PREDICTED_TIE)
                       * top), key=lambda p: p.level.level)
        if fastest.speed is not None and fastest.speed.tokens_per_second > (1 + PREDICTED_TIE) * \
                pick.speed.tokens_per_second:
            named.append(("faster", fastest))
    lightest = min(fits, key=lambda p: p.level.ledger.total, default=None)
    risky = pick.level.ledger.verdict(facts.budget) == "maybe"  # the budget inside the answer's band: name a margin
    if risky and lightest is not None and lightest.level.ledger.total < pick.level.ledger.total and \
            all(lightest.level.level != other.level.level for _, other in named):
        named.append(("lighter, the budget inside the answer's band", lightest))
    return named


def answer_lines(facts: CardEstimate, group: Sequence[Pick], pick: Optional[Pick], available_host: Optional[int]
                 ) -> List[str]:
    """The answer's lines: "use: ..." with why, then up to three alternatives, then where this machine's RAM
    would make a search here take another level. ``group`` and ``pick``: ``walked(facts)`` and its ``choose``."""
    if pick is None:
        lightest = min(facts.result.levels, key=lambda level: level.ledger.total)
        return [f"use: nothing is predicted to fit {format_size(facts.budget)}; the lightest level, {_name(lightest)}, "
                f"{lightest.candidate.describe()}, predicts {format_size(lightest.ledger.total)} (the levels below "
                "say by how much each is over)"]
    level = pick.level
    lines = [f"use: {_name(level)}{_dropped(facts, pick)}, {_figures(facts, pick)}",
             f"  why: {why(facts, pick, group)}"]
    for label, other in alternatives(facts, pick):
        gap = ""
        if other.speed is not None and pick.speed is not None and pick.speed.tokens_per_second:
            ratio = other.speed.tokens_per_second / pick.speed.tokens_per_second
            gap = f", {ratio:.1f}x the tok/s" if abs(ratio - 1) >= 0.05 else ", as fast"
        lines.append(f"  or ({label}): {_name(other.level)}, {_figures(facts, other)}{gap}: "
                     f"{_trade(facts, other, pick)}")
    if available_host is not None and level.ledger.host > available_host:
        here = choose(facts, walked(facts, usable=lambda lv: lv.ledger.host <= available_host))
        lines.append(f"  on this machine ({format_size(available_host)} of RAM available, "
                     f"{format_size(level.ledger.host)} needed) a search leaves that offloading out"
                     + (f" and takes {_name(here.level)}, {_figures(facts, here)}" if here is not None else
                        ": nothing else fits"))
    return lines
