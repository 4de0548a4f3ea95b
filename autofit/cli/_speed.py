"""The estimate's speed: predicted tokens per second of each level on the named card, and the fastest configuration
predicted to fit with what it trades against the next (``autofit.memory_model``'s throughput model). With
``--from DIR``, the throughput model calibrated on that search's timed probes (best.json's "speed_model") when it was
made for the same model, algorithm, device and card; on the CPU meter it also brings the machine's measured rates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

from autofit.core import InputError, SearchSpec
from autofit.machine import priced_card
from autofit.memory_model import (
    PRIOR_SPEED_UNCERTAINTY,
    Card,
    ModelShape,
    SpeedCalibration,
    SpeedEstimate,
    base_candidate,
    host_line,
    predict_speed,
    steps_on_host,
)
from autofit.rungs import rung_named
from autofit.search import host_card

SPEED_MODEL_KEY = "speed_model"  # best.json key of the calibrated throughput model (SpeedCalibration.to_dict())
# Levels predicted within this of the fastest are named in ladder order: a level that trades more (8-bit states, LoRA)
# for a percent of predicted speed is not the one to recommend, the model being no finer than that.
PREDICTED_TIE = 0.02


def fastest_first(speeds: Sequence[SpeedEstimate], levels: Sequence[Any], budget: int
                  ) -> List[Tuple[SpeedEstimate, Any]]:
    """(speed, level) of the levels predicted to fit, fastest first; where several are within ``PREDICTED_TIE`` of the
    fastest, the earliest of them (the fewest trades) comes first."""
    pairs = sorted(((speed, level) for speed, level in zip(speeds, levels, strict=True) if level.ledger.fits(budget)),
                   key=lambda pair: -pair[0].tokens_per_second)
    if not pairs:
        return pairs
    top = pairs[0][0].tokens_per_second
    first = min((pair for pair in pairs if pair[0].tokens_per_second >= (1 - PREDICTED_TIE) * top),
                key=lambda pair: pair[1].level)
    return [first] + [pair for pair in pairs if pair is not first]


def load_speed_calibration(spec: SearchSpec) -> Tuple[Optional[SpeedCalibration], List[str]]:
    """The throughput model calibrated by the search in ``--from DIR`` when it applies to ``spec`` (model, algo,
    device, and the card named); else None, with a note saying why when a directory was given."""
    from_dir = spec.options.from_dir
    if not from_dir:
        return None, []
    path = Path(from_dir) / "best.json"
    prior = f"tok/s from the uncalibrated throughput model (±{PRIOR_SPEED_UNCERTAINTY:.0%})"
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError, RecursionError):
        data = None  # the memory model's loading names the unreadable file (autofit.cli._estimate)
    stored = data.get(SPEED_MODEL_KEY) if isinstance(data, dict) else None
    if not stored:
        return None, [f"{path} has no calibrated throughput model ('{SPEED_MODEL_KEY}'): {prior}"] if data else []
    try:
        calibration = SpeedCalibration.from_dict(stored)
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise InputError(f"--from {path}: its throughput model cannot be read ({type(exc).__name__}: {exc}): run the "
                         "search again, or drop --from") from None
    mismatch = calibration.mismatch(base_candidate(spec), estimate_card(spec))
    if mismatch or calibration.points == 0:
        return None, [f"{path}'s throughput model was calibrated for {mismatch or 'no timed probe'}: {prior}"]
    return calibration, [f"tok/s calibrated on {calibration.points} timed probe(s) from {path} ({calibration.method}: "
                         f"compute x{calibration.compute_scale:.3f}, per micro-batch x{calibration.fixed_scale:.3f}, "
                         f"±{calibration.uncertainty:.0%})"]


def estimate_card(spec: SearchSpec) -> Optional[Card]:
    """The card whose peaks the speed is predicted on: the one ``--gpu-memory`` names (H100, L4, ...), else the GPU
    NVML reports where autofit knows it, with the host its ranks share (``autofit.search.host_card``: measured once
    per process); None for a size elsewhere, or the CPU."""
    card = priced_card(spec.options.gpu_memory, spec.device)
    return host_card(card, spec) if card is not None else None


def level_speeds(spec: SearchSpec, shape: ModelShape, levels: Sequence[Any]) -> Optional[List[SpeedEstimate]]:
    """Each level's predicted speed, in order (calibrated by ``--from DIR``'s search where it applies); None where no
    card is named and no calibration brings the CPU meter's rates."""
    calibration, _ = load_speed_calibration(spec)
    card = estimate_card(spec) or (calibration.card_of() if calibration is not None else None)
    if card is None:
        return None
    if calibration is not None:
        return [calibration.predict(level.candidate, shape, card) for level in levels]
    return [predict_speed(level.candidate, shape, card) for level in levels]


def _rates(card: Card) -> str:
    flops = f"{card.flops / 1e12:,.0f} TFLOP/s" if card.flops >= 1e12 else f"{card.flops / 1e9:,.1f} GFLOP/s"
    bandwidth = f"{card.bandwidth / 1e12:.2f} TB/s" if card.bandwidth >= 1e12 else f"{card.bandwidth / 1e9:,.1f} GB/s"
    return f"{card.source}: {flops}, {bandwidth}"


def speed_cell(speed: SpeedEstimate) -> str:
    return f"{speed.tokens_per_second:,.0f}"


def your_run_speed_line(spec: SearchSpec, speeds: Optional[List[SpeedEstimate]]) -> Optional[str]:
    """The user's run (level 0) at the predicted speed, per GPU where it runs on several, as the Trainer counts it."""
    if not speeds:
        return None
    speed = speeds[0]
    calibration, _ = load_speed_calibration(spec)
    card = estimate_card(spec) or (calibration.card_of() if calibration is not None else None)
    per_gpu = (f" ({speed.tokens_per_second_per_gpu:,.0f} per GPU, what the Trainer's train_tokens_per_second "
               f"reports)") if speed.ranks > 1 else ""
    where = f"{speed.ranks} x {card.name}" if speed.ranks > 1 and card else f"one {card.name}" if card else "here"
    return (f"your run's speed on {where}: {speed_cell(speed)} tok/s{per_gpu}, {speed.seconds_per_step:.2f} s per "
            f"optimizer step, ± {speed.uncertainty:.0%}")


def speed_lines(spec: SearchSpec, levels: Sequence[Any], speeds: Optional[List[SpeedEstimate]]) -> List[str]:
    """The fastest level predicted to fit, and the trade against the next fastest; or how to get a speed."""
    budget = spec.budget_bytes
    calibration, notes = load_speed_calibration(spec)
    if speeds is None:
        lines = [f"note: {note}" for note in notes]
        if spec.device == "cuda":
            return lines + ["speed: priced on no card (a size names none, and no GPU autofit knows is here): name "
                            "one (--gpu-memory H100, L4, A6000, RTX4090, ...) for tokens/s from its published peaks"]
        return lines
    card = estimate_card(spec) or (calibration.card_of() if calibration is not None else None)
    assert card is not None and budget is not None  # speeds come with a card; an estimate has a budget
    fitting = fastest_first(speeds, levels, budget)
    lines = [f"speed on one {card.name} ({_rates(card)}): tok/s predicted ± {speeds[0].uncertainty:.0%}, "
             + ("calibrated" if calibration is not None else "uncalibrated")]
    lines += [f"note: {note}" for note in (*notes, *speeds[0].notes)]
    if any(steps_on_host(level.candidate) for level in levels):
        lines.append(host_line(card, spec.ranks))
    if not fitting:
        return lines
    best, level = fitting[0]
    slowest = max(best.terms.items(), key=lambda item: item[1])
    lines.append(f"fastest predicted fit: level {level.level} ({'+'.join(level.rungs) or 'baseline'}), "
                 f"{level.candidate.describe()}: {speed_cell(best)} tok/s, {best.seconds_per_step:.2f} s per optimizer "
                 f"step (most of it {slowest[0]})" + _engine(level.candidate))
    if len(fitting) > 1:
        second, other = fitting[1]
        gap = 1 - second.tokens_per_second / best.tokens_per_second
        relation = (f"{gap:.0%} slower" if gap >= 0.005 else "as fast" if gap > -0.005 else
                    f"{-gap:.0%} faster, inside the model's {PREDICTED_TIE:.0%}: the fewer trades first")
        lines.append(f"  next: level {other.level} ({'+'.join(other.rungs) or 'baseline'}) at "
                     f"{speed_cell(second)} tok/s, {relation}" + _trade(level, other))
    return lines


def _engine(candidate: Any) -> str:
    """Which generation engine the speed prices (GRPO and RLOO)."""
    if not candidate.is_rl or candidate.unit.counts_episodes:
        return ""
    if candidate.vllm:
        return f"; generation priced as vLLM runs it ({candidate.vllm}: CUDA-graph decode steps, the weights synced)"
    return "; generation priced as transformers' generate runs it (every operator launched at every token)"


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
        fitting = fastest_first(speeds, levels, spec.budget_bytes) if speeds else []
        fastest = fitting[0] if fitting else None
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
