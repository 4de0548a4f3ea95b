"""``autofit search``: the command line. Exit codes: 0 a fitting config was written, 2 bad input (the user's trainer
factory failing included), 3 nothing fits, 4 probes cannot run here (not a memory answer), 130 interrupted."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import List, Optional

from autofit import __version__
from autofit.cli._argtypes import gpus, positive_int, verify_steps

EXIT_OK, EXIT_BAD_INPUT, EXIT_NO_FIT, EXIT_PROBES_CANNOT_RUN = 0, 2, 3, 4
EXIT_CODES = """exit codes:
  0  a configuration that fits was written (best.yaml, best.json)
  2  bad input, or your trainer factory failed (one line names the value, or your code's frames)
  3  nothing fits, even at the last rung: a probe ran out of memory or the memory model ruled it out
  4  probes cannot run here: the same non-memory error on two candidates (bad fork, full disk, CUDA driver,
     missing package, probe killed by the host); the message names the cause and the probe log
  130 interrupted: run the same command again to resume"""

log = logging.getLogger("autofit")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        self.exit(EXIT_BAD_INPUT, f"autofit: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from autofit.core import FACTORIES

    parser = _Parser(prog="autofit", description="Find the best TRL training configuration that fits your GPU.")
    parser.add_argument("--version", action="version", version=f"autofit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    search = commands.add_parser("search", help="probe real training runs and write the best config that fits",
                                 epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    search.add_argument("--model", required=True, help="hub id (bundled configs work offline) or local folder")
    search.add_argument("--algo", default="sft", help=f"one of: {', '.join(FACTORIES)} (default sft)")
    search.add_argument("--factory", metavar="MODULE:FUNCTION",
                        help="probe your own trainer: a function that builds it from a candidate (see autofit.fit)")
    search.add_argument("--gpu-memory", help="budget, e.g. 24GiB; default the card's memory; required on CPU")
    search.add_argument("--device", default="auto", help="auto, cuda or cpu (cpu: simulated device meter)")
    search.add_argument("--max-length", type=positive_int, help="sequence length, sft (default 1024)")
    search.add_argument("--min-length", type=positive_int, help="floor for shorter sequences (default: never cut)")
    rl = search.add_argument_group("grpo, rloo and ppo")
    rl.add_argument("--max-completion-length", type=positive_int, help="completion (ppo: response) length (default 512)")
    rl.add_argument("--min-completion-length", type=positive_int, help="floor for shorter completions")
    rl.add_argument("--max-prompt-length", type=positive_int, default=128, help="synthetic prompt length (128)")
    rl.add_argument("--num-generations", type=int, help="completions per prompt (default: TRL's)")
    rl.add_argument("--use-vllm", metavar="MODE",
                    help="vLLM generates: colocate (in each training process) or server (trl vllm-serve elsewhere); "
                         "probed where vLLM is installed, estimated where not")
    rl.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3,
                    help="colocate: the share of each GPU vLLM takes (TRL's default 0.3)")
    rl.add_argument("--beta", type=float, help="KL coefficient; > 0 loads and measures the reference model")
    search.add_argument("--effective-batch", type=positive_int, default=8,
                        help="micro-batch x accumulation, kept exactly (default 8)")
    search.add_argument("--gpus", type=gpus, default=1,
                        help="GPUs on this machine that train together, a number or 'all' (default 1): each probe "
                             "runs one process per GPU through accelerate, and the sharding rungs (ZeRO, FSDP2) apply")
    search.add_argument("--nodes", type=positive_int, default=1,
                        help="machines to export for (default 1): the probes run this machine's --gpus; the "
                             "accelerate config is written for all of them, with the ledger's per-GPU figure")
    search.add_argument("--maximize", default="batch", help="batch (default) or length (longest that fits)")
    search.add_argument("--ladder", help="comma-separated rung names, in order (default: the whole ladder)")
    search.add_argument("--out", dest="out_dir", default="autofit-out",
                        help="output folder; the study there is resumed")
    search.add_argument("--real-weights", action="store_true", help="load the model's weights instead of random")
    search.add_argument("--dtype", help="load the weights in this dtype (auto, bfloat16, float16, float32), as "
                                        "TRL's --dtype; default: float32 (TRL's), bfloat16 only as a rung")
    search.add_argument("--probe-steps", type=positive_int, default=2, help="optimizer steps per probe (>= 2)")
    search.add_argument("--verify-steps", type=verify_steps, default="auto",
                        help="optimizer steps of the check run, or auto (default): at least 3, at most 10, "
                             "stopping after 60 s of training")
    search.add_argument("--probe-timeout", dest="probe_timeout_s", type=float, default=900.0,
                        help="seconds before a probe is killed (default 900)")
    search.add_argument("--build-timeout", dest="build_timeout_s", type=float, default=600.0,
                        help="seconds the trainer factory may take to build the trainer (default 600)")
    search.add_argument("--max-probes", type=positive_int, help="stop probing after N probes and choose")
    search.add_argument("--headroom", type=float, help="fraction of the budget kept free (default 0.03 on CUDA)")
    search.add_argument("--no-predict", dest="predict", action="store_false",
                        help="probe without the memory model: no predicted start, no skipped candidates")
    search.add_argument("--trust-remote-code", action="store_true",
                        help="run the model's own code (auto_map in config.json) in probes, as TRL's flag of that name")
    search.add_argument("--allow-busy-gpu", action="store_true",
                        help="search within the memory other processes leave free (default: exit 2 when it is less "
                             "than the budget)")
    search.add_argument("-q", "--quiet", action="store_true", help="only the final table")
    from autofit.cli import _estimate as estimate

    estimate.add_parser(commands)
    report = commands.add_parser("report", help="draw DIR/report.html again from a search's best.json and study",
                                 description="Render report.html from the best.json and the Optuna study that "
                                             "`autofit search --out DIR` left in DIR.")
    report.add_argument("out_dir", metavar="DIR", help="the --out folder of a search")
    return parser


def report_command(args) -> int:
    from autofit.core import one_line
    from autofit.report import write
    from autofit.core import InputError

    try:
        path = write(Path(args.out_dir))
    except InputError as exc:
        print(f"autofit: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"wrote {path}")
    return EXIT_OK


def search_options(args) -> dict:
    """The parsed options as ``autofit.search._question.search_spec`` (and ``autofit.fit``) name them."""
    options = dict(vars(args))
    for key in ("command", "quiet", "handler", "factory"):
        options.pop(key, None)
    return options


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "estimate":
        from autofit.cli import _estimate as estimate

        return estimate.run(args)
    if args.command == "report":
        return report_command(args)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
    from autofit._api import no_fit_message, run_search
    from autofit.export import table_text
    from autofit.probe import FactoryError, prepare_factory
    from autofit.core import one_line
    from autofit.search import InfrastructureError
    from autofit.search import search_spec
    from autofit.core import UnknownModelError, resolve_model
    from autofit.core import InputError
    from autofit.core import format_size

    try:
        payload = prepare_factory(args.factory) if args.factory else None
        spec = search_spec(**search_options(args), factory=payload.identity if payload else None)
        resolve_model(spec.model)
        report = run_search(spec, factory=payload)
    except FactoryError as exc:  # several lines on purpose: the user's own frames
        print(f"autofit: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (InputError, UnknownModelError) as exc:
        print(f"autofit: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except InfrastructureError as exc:
        print(f"autofit: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_PROBES_CANNOT_RUN
    except KeyboardInterrupt:
        print(f"autofit: interrupted; run the same command again to resume from {args.out_dir}", file=sys.stderr)
        return 130
    print(table_text(report))
    for note in report.notes:
        print(f"note: {note}")
    if not report.fits:
        print(f"autofit: {no_fit_message(report)}", file=sys.stderr)
        print(f"details: {spec.out_dir / 'best.json'}")
        if (spec.out_dir / "report.html").exists():
            print(f"report: {spec.out_dir / 'report.html'}")
        return EXIT_NO_FIT
    chosen, verified = report.chosen.candidate, report.verified
    print(
        f"best: {chosen.describe()} [{', '.join(chosen.rungs) or 'no rung needed'}], "
        f"verified peak {format_size(verified.peak_bytes)} of {format_size(spec.budget_bytes)} over "
        f"{verified.steps} steps, {verified.tokens_per_second:,.0f} tok/s"
        + (f" ({verified.generation_tokens_per_second:,.0f} tok/s generating)"
           if verified.generation_tokens_per_second else "") + "; "
        f"{report.probes_run} new probes, {sum(r.cached for r in report.records)} reused from {spec.out_dir}"
    )
    print(f"wrote {spec.out_dir / 'best.yaml'} and {spec.out_dir / 'best.json'}")
    if (spec.out_dir / "report.html").exists():
        print(f"report: {spec.out_dir / 'report.html'}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
