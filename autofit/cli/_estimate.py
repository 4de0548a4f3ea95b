"""``autofit estimate``: what the memory model predicts for the baseline and for each level of the ladder, and which
rung it expects to be needed first. No probe runs and torch is never imported in this process, so it answers in a
fraction of a second, for a GPU this machine does not have (the first time a model is estimated, its parameters are
counted from the model built on the meta device in a separate process: a few seconds, then cached). Its options are
``SearchOptions``' (the estimate door's), resolved by ``autofit.search.estimate_question``. With ``--config`` it
prints the user's run at each phase of its step, both meters; ``--json`` prints the same as one JSON document
(``_estimate_json``). Both are drawn from one ``CardEstimate`` per card (``_estimate_facts``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from autofit.cli._answer import answer_lines, choose, walked
from autofit.cli._estimate_facts import CardEstimate, card_estimate, parameters_line, phase_label
from autofit.cli._estimate_json import estimate_json, refused_json
from autofit.cli._first_step_lines import first_step_line
from autofit.cli._speed import comparison_lines, speed_cell, speed_lines, your_run_speed_line
from autofit.cli._stored import load_calibration
from autofit.core import (
    ESTIMATE,
    RL_ALGOS,
    InputError,
    SearchOptions,
    SearchSpec,
    add_options,
    algorithm,
    format_size,
    given_values,
    one_line,
)
from autofit.memory_model import (
    TERM_GROUPS,
    Calibration,
    Ledger,
    ModelShape,
    RungEstimate,
    expected_rung,
    level_vllm_line,
    prior_uncertainty,
)
from autofit.rungs import replacement_trade

__all__ = ["estimate_text", "load_calibration", "parameters_line", "render_text", "run"]

EXIT_OK, EXIT_BAD_INPUT = 0, 2

# Columns of the table: (header, ledger terms summed into it).
COLUMNS: Tuple[Tuple[str, Tuple[str, ...]], ...] = tuple((header, terms) for header, _, terms in TERM_GROUPS)
OUTSIDE_TENSORS = ("allocator", "cuda_context")  # what nvidia-smi shows beyond PyTorch's allocated peak
TENSOR_COLUMNS = tuple((header, terms) for header, terms in COLUMNS if not set(terms) & set(OUTSIDE_TENSORS))


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``estimate`` on the CLI's subparsers; returns its parser."""
    parser = subparsers.add_parser(
        "estimate", help="predict peak memory per ladder level with the analytic memory model (no probe, no torch)",
        description="Predict the peak device memory of the baseline and of each ladder level, without probing.",
    )
    add_options(parser, ESTIMATE)
    parser.set_defaults(handler=run)
    return parser


def plot_levels(spec: SearchSpec, result: RungEstimate, path: str) -> None:
    """Stacked bars of the ledger's terms, one per ladder level, and the budget line."""
    from autofit.memory_model import TERMS
    from autofit.report import ledger_figure, save

    rows = [(f"{level.level}: {'+' + level.rungs[-1] if level.rungs else 'baseline'} "
             f"({level.candidate.micro_batch}x{level.candidate.grad_accum}, len {level.candidate.max_length})",
             {term: float(getattr(level.ledger, term)) for term in TERMS}) for level in result.levels]
    budget = spec.budget_bytes
    title = f"autofit estimate: {spec.options.algo} {spec.options.model}, budget {format_size(budget)}"
    save(ledger_figure(rows, budget, title), path)


def _check_plot_path(path: Optional[str]) -> None:
    from autofit.report import PLOT_SUFFIXES

    if path is None:
        return
    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"--plot '{path}': the file must end in {', '.join(PLOT_SUFFIXES)}")
    if not Path(path).resolve().parent.is_dir():
        raise InputError(f"--plot '{path}': the folder {Path(path).resolve().parent} does not exist")


def _unit(budget: float) -> Tuple[str, float]:
    return ("GiB", 2**30) if budget >= 2 * 2**30 else ("MiB", 2**20)


def _fits_cell(ledger, budget: int) -> str:
    answer = "yes" if ledger.fits(budget) else "no"
    return answer if ledger.verdict(budget) != "maybe" else answer + "?"


def estimate_text(spec: SearchSpec, calibration: Optional[Calibration] = None, notes: Sequence[str] = (),
                  result: Optional[RungEstimate] = None) -> str:
    """The report printed by ``autofit estimate`` for one card (``render_text`` of its ``card_estimate``)."""
    return render_text(card_estimate(spec, calibration, notes, result))


def render_text(facts: CardEstimate) -> str:
    """One row per ladder level (the level's largest micro-batch predicted to fit, else its smallest), the ledger's
    terms at the predicted peak, the band and the verdict; the user's run at each phase; the expected level."""
    spec, result, budget, shape = facts.spec, facts.result, facts.budget, facts.shape
    length_name = "max_completion_length" if spec.options.algo in RL_ALGOS else "max_length"
    lines = [
        f"autofit estimate: {spec.options.algo} {spec.options.model} on {spec.device}, budget "
        f"{format_size(spec.gpu_bytes)}"
        + (" per GPU" if spec.ranks > 1 else "")
        + (f" (vLLM colocated: {spec.options.vllm_gpu_memory_utilization:.0%} of it, the generation column)"
           if spec.options.use_vllm == "colocate" else "")
        + f", effective batch {spec.options.effective_batch}" + (f" over {spec.ranks} GPUs" if spec.ranks > 1 else "")
        + f", {length_name} {spec.max_length}"
        + (f", prompt {spec.options.max_prompt_length}" if spec.options.algo in RL_ALGOS else ""),
    ]
    from autofit.search import available_host_bytes

    group = walked(facts)
    pick = choose(facts, group)  # what a search is expected to write: the answer, first
    lines += answer_lines(facts, group, pick, available_host_bytes())
    if facts.calibration is None:
        lines.append(f"memory model: analytic prior, uncalibrated "
                     f"(±{prior_uncertainty(shape, spec.options.algo):.0%}), "
                     f"{parameters_line(shape, spec.options.algo)}")
    lines += [f"note: {note}" for note in facts.question_notes()]
    unit, scale = _unit(budget)
    if spec.baseline is not None:
        lines.append(your_run_line(spec, result))
        lines += phase_lines(facts.run_phases, unit, scale)
        speed_line = your_run_speed_line(spec, facts.speeds)
        lines += [speed_line] if speed_line else []
    lines += facts.vllm
    lines += [f"note: {note}" for note in (*facts.left_out, *facts.ladder_notes)]
    host = any(level.ledger.host for level in result.levels)  # an offloading level: its host memory, a column
    columns = COLUMNS if spec.options.wide else ()  # the terms: 70 columns more (--wide)
    header = (["lvl", "rung (cumulative)", "batch", "len"] + [name for name, _ in columns]
              + ["peak", "±", "phase", "fits"])
    header += ["host"] if host else []
    speeds = facts.speeds
    header += ["tok/s"] if speeds else []
    rows = []
    for index, level in enumerate(result.levels):
        ledger, candidate = level.ledger, level.candidate
        cells = [str(level.level), _rung_cell(level, result.levels[index - 1] if index else None),
                 f"{candidate.micro_batch}x{candidate.grad_accum}", str(candidate.max_length)]
        cells += [f"{sum(getattr(ledger, term) for term in terms) / scale:.2f}" for _, terms in columns]
        cells += [f"{ledger.total / scale:.2f}", f"{ledger.total * ledger.uncertainty / scale:.2f}", ledger.phase,
                  _fits_cell(ledger, budget)]
        cells += [f"{ledger.host / scale:.2f}" if ledger.host else "-"] if host else []
        cells += [speed_cell(speeds[index])] if speeds else []
        rows.append(cells)
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    left = {1, header.index("phase")}  # rungs and phase read better left-aligned

    def render(row):
        return "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    title = f"predicted peak by term ({unit}), at each level's peak phase:" if columns else \
        f"predicted peak ({unit}) at each level's peak phase (--wide: by term):"
    lines += ["", title, render(header)]
    lines += [render(row) for row in rows]
    lines.append("fits: the point prediction against the budget; '?' when the budget lies inside the ± band")
    if host:
        lines.append("host: host memory (pinned RAM) offloaded optimizer states and activations take, not counted in "
                     "the device's peak")
    lines += [f"level {level.level} ({_rung_cell(level, None)}): {replacement_trade(level.candidate)}"
              for level in result.levels if level.candidate.replaces]  # an engine of autofit's instead of yours
    lines += speed_lines(spec, result.levels, speeds)
    rl = algorithm(spec.options.algo).rl
    if rl:  # the step users report failing: fine at step 1, out of memory at step 2
        lines.append(first_step_line("level 0 (the run as asked)", result.levels[0].candidate, shape, spec.device,
                                     facts.calibration, budget))
    if pick is None:
        return "\n".join(lines)
    chosen = pick.level
    lines += ["", f"use, level {chosen.level} ({'+'.join(chosen.rungs) or 'baseline'}), {chosen.candidate.describe()}: "
              "predicts "
              f"{format_size(chosen.ledger.total)} ± {format_size(chosen.ledger.total * chosen.ledger.uncertainty)} "
              f"of {format_size(budget)}; {_views(chosen.ledger, spec.device)}"]
    if rl:  # generation and training peak apart: the update's phases, in order
        lines.append(f"  {_phases_line(chosen.ledger, algorithm(spec.options.algo).phases, unit, scale)}")
        if chosen.level:
            lines.append("  " + first_step_line(f"level {chosen.level}", chosen.candidate, shape, spec.device,
                                                facts.calibration, budget))
    vllm_line = level_vllm_line(chosen.candidate, shape, chosen.ledger.total, budget)
    lines += [f"  {vllm_line}"] if vllm_line else []
    expected = result.expected
    if result.dropped and expected is not None and expected.level == chosen.level:
        lines.append(f"  without {', '.join(result.dropped)}: the level is predicted to fit without "
                     + ("it" if len(result.dropped) == 1 else "them") + f" ({expected.candidate.describe()}, "
                     f"{format_size(expected.ledger.total)}), as the search drops rungs that buy nothing")
    if chosen.ledger.host:
        lines.append(f"  {_host_line(chosen.ledger.host)}")
    return "\n".join(lines)


def _rung_cell(level, before) -> str:
    """A level's row: the rung it adds, and the rungs of the level before that it leaves out (the quality rungs take
    optimizer offload off again)."""
    if not level.rungs:
        return "baseline"
    dropped = [name for name in (before.rungs if before is not None else ()) if name not in level.rungs]
    return "+" + level.rungs[-1] + "".join(f" -{name}" for name in dropped)


def _phases_line(ledger: Ledger, phases: Sequence[str], unit: str, scale: float) -> str:
    """The ledger's total at each phase of a step, in the order a step goes through them."""
    known = [name for name in phases if name in ledger.phase_totals]
    known += [name for name in ledger.phase_totals if name not in known]
    cells = ", ".join(f"{name} {ledger.phase_totals[name] / scale:.2f}" for name in known)
    return f"by phase ({unit}): {cells}; the peak is {ledger.phase}"


def _host_line(needed: float) -> str:
    """The expected configuration's host memory against this machine's, which the search checks before a probe."""
    from autofit.search import available_host_bytes

    available = available_host_bytes()
    line = f"host memory: {format_size(needed)} pinned for offloading"
    if available is None:
        return line + "; this machine's available RAM is unknown"
    if needed > available:
        return (line + f", more than the {format_size(available)} this machine has available: a search here leaves "
                "the offloading rung out (run it where the RAM is)")
    return line + f", within the {format_size(available)} this machine has available"


def your_run_line(spec: SearchSpec, result: RungEstimate) -> str:
    """The user's run as their --config file writes it (the ladder's level 0): its peak against the budget."""
    ledger, candidate = result.levels[0].ledger, result.levels[0].candidate
    budget = spec.budget_bytes
    assert budget is not None  # an estimate has a budget
    band = f"{format_size(ledger.total)} ± {format_size(ledger.total * ledger.uncertainty)}"
    if ledger.refused:
        verdict = f"does not run: {ledger.refused}"
    elif ledger.fits(budget):
        verdict = f"fits in {format_size(budget)}, {format_size(budget - ledger.total)} to spare"
    else:
        verdict = f"does not fit: {format_size(ledger.total - budget)} over {format_size(budget)}"
    maybe = " (the budget lies inside the band)" if ledger.verdict(budget) == "maybe" else ""
    where = spec.options.config or (spec.baseline.source if spec.baseline else "")
    return (f"your run ({where} as written): {candidate.describe()} predicts {band} at its peak "
            f"({ledger.phase}): {verdict}{maybe}; {_views(ledger, spec.device)}"
            + (f"; host memory (pinned RAM) {format_size(ledger.host)} for what it offloads" if ledger.host else ""))


def phase_lines(ledgers: Sequence[Ledger], unit: str, scale: float) -> List[str]:
    """The user's run at each phase of its step, in order, by term: PyTorch's allocated peak of the phase (what
    ``torch.cuda.max_memory_allocated`` reports) and what nvidia-smi shows (reserved + CUDA context), so a figure
    published for one phase (after the backward, at the step) reads straight off it."""
    if not ledgers:
        return []
    cuda = any(ledger.cuda_context for ledger in ledgers)
    figures = (["PyTorch", "+alloc", "+ctx", "nvidia-smi"] if cuda else ["live tensors"])
    header = ["phase"] + [name for name, _ in TENSOR_COLUMNS] + figures + [""]
    peak = max(ledgers, key=lambda ledger: ledger.total).phase
    rows = []
    for ledger in ledgers:
        cells = [phase_label(ledger.phase)]
        cells += [f"{sum(getattr(ledger, term) for term in terms) / scale:.2f}" for _, terms in TENSOR_COLUMNS]
        cells += ([f"{ledger.allocated / scale:.2f}", f"{ledger.allocator / scale:.2f}",
                   f"{ledger.cuda_context / scale:.2f}"] if cuda else [])
        rows.append(cells + [f"{ledger.total / scale:.2f}", "peak" if ledger.phase == peak else ""])
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    meters = ("PyTorch = max_memory_allocated; nvidia-smi = PyTorch + the allocator's reserve + the CUDA context"
              if cuda else "the simulated meter counts live tensors")
    lines = [f"your run at each phase ({unit}, {meters}):"]
    lines += ["  " + "  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(row, widths, strict=True))).rstrip()
              for row in [header] + rows]
    return lines


def _views(ledger: Ledger, device: str) -> str:
    """The two figures users compare: PyTorch's peak and what nvidia-smi shows (what the search holds)."""
    if device != "cuda":
        return "the simulated meter counts live tensors"
    return (f"PyTorch allocates {format_size(ledger.allocated)} at the peak, nvidia-smi shows "
            f"{format_size(ledger.total)} (reserved + CUDA context: what the search holds against the budget)")


def run(args: argparse.Namespace) -> int:
    """Print the estimate, for each card of ``--gpu-memory A,B`` and then their comparison; 0, or 2 with a one-line
    message on bad input."""
    from autofit.launch import read_launch, with_launch
    from autofit.memory_model import ensure_census
    from autofit.search import estimate_question

    estimates: List[CardEstimate] = []
    try:
        given = getattr(args, "gpu_memory", None)
        cards = [part.strip() for part in given.split(",")] if isinstance(given, str) and "," in given else [given]
        if len(cards) > 1 and getattr(args, "plot", None):
            raise InputError(f"--plot draws one card's levels, not the {len(cards)} of --gpu-memory {given}")
        launch = None
        for card in cards:  # each card read and refused as --gpu-memory alone would be
            one = argparse.Namespace(**{**vars(args), "gpu_memory": card})
            values = {**getattr(args, "launch", {}), **given_values(one, ESTIMATE)}
            launch = launch or read_launch(values)  # the launch is read once, whatever the cards
            options = SearchOptions(**with_launch(values, launch))
            spec = estimate_question(options, launch)
            ensure_census(options.model, trust_remote_code=options.trust_remote_code)
            ModelShape.from_model(options.model)
            _check_plot_path(options.plot)
            calibration, notes = load_calibration(options.from_dir, spec)
            result = expected_rung(spec, spec.budget_bytes, calibration=calibration)
            estimates.append(card_estimate(spec, calibration, notes, result, card=str(card), plot=options.plot))
            if options.plot:
                plot_levels(spec, result, options.plot)
    except (InputError, ValueError) as exc:
        return _refused(args, one_line(exc))
    except (KeyError, TypeError, ArithmeticError, RecursionError, AttributeError) as exc:  # a crafted config.json
        return _refused(args, f"the configuration of model '{one_line(args.model)}' cannot be estimated "
                              f"({type(exc).__name__}: {one_line(exc)}): check its config.json")
    if getattr(args, "as_json", False):
        print(estimate_json(estimates))
        return EXIT_OK
    texts = [render_text(facts) + (f"\nplot: {facts.plot}" if facts.plot else "") for facts in estimates]
    if len(estimates) > 1:
        texts.append("\n".join(comparison_lines([(facts.card, facts.spec, facts.result) for facts in estimates])))
    print("\n\n".join(texts))
    return EXIT_OK


def _refused(args: argparse.Namespace, line: str) -> int:
    """Bad input: one line on stderr, exit 2; under --json also the document that says so, on stdout."""
    print(f"autofit: error: {line}", file=sys.stderr)
    if getattr(args, "as_json", False):
        print(refused_json(line))
    return EXIT_BAD_INPUT
