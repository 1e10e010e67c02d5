"""``lossless-check`` command line: ``run`` and ``list``.

Exit codes: 0 every case lossless; 1 at least one case not lossless (or a generator error);
2 bad usage or input; 3 internal error.
"""

from __future__ import annotations

import argparse
import sys

from .errors import UsageError
from .options import positive_int, probability

EXIT_OK, EXIT_NOT_LOSSLESS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
#: Trials per case: position 1 then detects a TV of about 0.07 (vocabulary 8, family alpha 1e-6).
DEFAULT_SAMPLES = 5_000


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lossless-check", description="Statistical losslessness checks of speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run losslessness checks")
    run.add_argument("--generator", action="append", metavar="NAME|module:attr",
                     help="generator to check (repeatable; default: every built-in with an adapter)")
    run.add_argument("--warpers", action="append", metavar="k=v,k=v",
                     help="a warper stack as GenerationConfig kwargs (repeatable); 'none' for plain sampling")
    run.add_argument("--matrix", choices=("smoke", "default", "full"), default=None,
                     help="a named set of warper stacks (default when no --warpers: default)")
    run.add_argument("--mode", choices=("step", "provenance", "generate", "all"), default="step",
                     help="step: statistical, one round; provenance: exact check of q; generate: the real "
                          "generate() loop; all: step with provenance beside it, plus generate")
    run.add_argument("--scenario", default="markov8",
                     help="markov8, iid8 (fixed logits), or tiny-llama (random 2-layer Llamas; generate mode only)")
    run.add_argument("--max-new-tokens", type=positive_int, default=4, metavar="K",
                     help="generate mode: tokens per generate() call, each position tested (default 4)")
    run.add_argument("--samples", type=positive_int, default=DEFAULT_SAMPLES,
                     help=f"trials per case (default {DEFAULT_SAMPLES})")
    run.add_argument("--detect-tv", type=probability, metavar="TV",
                     help="size the run: enough samples per case to detect this TV at position 1 with power 0.99")
    run.add_argument("--sequential", action="store_true",
                     help="stop a case at the first trial where its anytime-valid e-value rejects (clean cases run to --samples)")
    run.add_argument("--timeout", type=positive_int, default=600, metavar="S",
                     help="seconds a chunk of 1000 trials may take before its case is an error (default 600)")
    run.add_argument("--alpha", type=probability, default=1e-6, help="family-wise false-failure rate (default 1e-6)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--workers", type=positive_int, default=1, help="processes (results do not depend on it)")
    run.add_argument("--json", metavar="PATH", help="write the JSON report here")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    gate = sub.add_parser("gate", help="pre-merge gate: every mode that applies over a matrix; JSON, Markdown, HTML")
    gate.add_argument("--generator", required=True, metavar="NAME|module:attr")
    gate.add_argument("--out", default="lossless-gate", metavar="DIR", help="report directory (default lossless-gate)")
    gate.add_argument("--matrix", choices=("smoke", "default", "full"), default="default")
    gate.add_argument("--scenario", default="markov8")
    gate.add_argument("--samples", type=positive_int, default=DEFAULT_SAMPLES)
    gate.add_argument("--alpha", type=probability, default=1e-6)
    gate.add_argument("--seed", type=int, default=0)
    gate.add_argument("--workers", type=positive_int, default=1)
    gate.add_argument("--sequential", action="store_true")
    gate.add_argument("--quiet", action="store_true")
    mutants = sub.add_parser("mutants", help="mutation self-test: every mutant of fixtures/mutants (run from the repo root)")
    mutants.add_argument("--samples", type=positive_int, default=DEFAULT_SAMPLES, help="most trials per mutant")
    mutants.add_argument("--alpha", type=probability, default=1e-6)
    mutants.add_argument("--seed", type=int, default=0)
    mutants.add_argument("--json", metavar="PATH")
    sub.add_parser("list", help="generators in the installed transformers and their adapters; warper matrices")
    return parser


def _cases(args):
    from .adapters import resolve_generator
    from .matrix import DEFAULT_GENERATORS, matrix
    from .runner import Case
    from .scenarios import SCENARIOS
    from .warpers import parse_warpers

    scenario = SCENARIOS.get(args.scenario)
    if args.scenario == "tiny-llama":
        if args.mode != "generate":
            raise UsageError("the tiny-llama scenario runs in generate mode only (--mode generate)")
        from .generate_mode import TINY_LLAMA as scenario
    if scenario is None:
        raise UsageError(f"unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}, tiny-llama")
    generators = [resolve_generator(g) for g in (args.generator or DEFAULT_GENERATORS)]
    stacks = [parse_warpers(w) for w in args.warpers or []]
    if args.matrix or not stacks:
        stacks += matrix(args.matrix or "default")
    modes = ["all", "generate"] if args.mode == "all" else [args.mode]
    return [Case(g, w, mode, scenario) for mode in modes for g in generators for w in stacks]


def samples_to_detect(cases, tv: float, alpha: float, max_new_tokens: int = 4, sequential: bool = False) -> int:
    """Samples per case so that each statistical case detects ``tv`` at position 1 with power 0.99.

    A sequential run gives its fixed-sample test half of each case's alpha (the anytime test has the
    other half), and a clean case stops exactly there.
    """
    from .runner import POWER
    from .stats import samples_for_tv

    statistical = [c for c in cases if c.mode != "provenance"] or cases
    positions = max(max_new_tokens if c.mode == "generate" else c.scenario.gamma + 1 for c in statistical)
    vocab = max(c.scenario.vocab_size for c in statistical)
    alpha_position = alpha / len(statistical) / positions / (2 if sequential else 1)
    return samples_for_tv(tv, vocab, alpha_position, POWER)


def _run(args) -> int:
    from rich.console import Console

    from .modes import run_modes
    from .report import print_table, write_json

    cases = _cases(args)
    if args.detect_tv is not None:
        args.samples = samples_to_detect(cases, args.detect_tv, args.alpha, args.max_new_tokens, args.sequential)
    with _progress(args.quiet) as progress:
        task = progress.add_task(f"{len(cases)} cases", total=len(cases) * args.samples)
        result = run_modes(cases, args.samples, args.alpha, args.seed, args.workers,
                           lambda k: progress.advance(task, k), args.max_new_tokens, args.sequential, args.timeout)
    print_table(result, Console(width=None if sys.stdout.isatty() else 160))
    if args.json:
        write_json(result, args.json)
    return result.exit_code


def _progress(quiet: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), disable=quiet, transient=True)


def _gate(args) -> int:
    from rich.console import Console

    from .gate import gate

    with _progress(args.quiet) as progress:
        task = progress.add_task("gate", total=None)
        code = gate(args.generator, args.out, matrix_name=args.matrix, samples=args.samples, alpha=args.alpha,
                    seed=args.seed, scenario=args.scenario, workers=args.workers, sequential=args.sequential,
                    progress=lambda k: progress.advance(task, k))
    Console().print(f"gate {'passed' if code == 0 else 'failed'} (exit {code}); reports in {args.out}/"
                    "report.{json,md,html}", highlight=False)
    return code


def _mutants(args) -> int:
    """Exit 0 when every bug mutant is caught and every equivalent one passes, else 1."""
    import json

    from .mutation import mutation_report, print_mutation_report

    from rich.console import Console

    rows = mutation_report(args.samples, args.seed, args.alpha)
    print_mutation_report(rows, Console(width=None if sys.stdout.isatty() else 200))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([{k: v for k, v in row.items() if k != "positions"} for row in rows], handle, indent=2)
    return EXIT_OK if all(row["correct"] for row in rows) else EXIT_NOT_LOSSLESS


def _list() -> int:
    from rich.console import Console
    from rich.table import Table
    from transformers.generation import candidate_generator as cg

    from .adapters import ADAPTERS
    from .compat import versions
    from .matrix import MATRIX_NAMES, available_catalog, matrix
    from .warpers import format_warpers

    table = Table(title=f"candidate generators in transformers {versions()['transformers_version']}",
                  title_justify="left")
    table.add_column("generator")
    table.add_column("adapter")
    names = sorted(n for n, obj in vars(cg).items()
                   if isinstance(obj, type) and issubclass(obj, cg.CandidateGenerator) and obj is not cg.CandidateGenerator)
    for name in sorted(set(names) | set(ADAPTERS)):
        if name in ADAPTERS:
            status = "yes" if name in names else "yes (generator not installed: skipped)"
        else:
            status = "no adapter yet"
        table.add_row(name, status)
    console = Console()
    console.print(table)
    for entry in available_catalog():
        history = " (history-dependent)" if entry.history_dependent else ""
        console.print(f"warper {entry.option}: {format_warpers(entry.kwargs)}{history}", highlight=False)
    for name in MATRIX_NAMES:
        console.print(f"matrix {name}: {len(matrix(name))} warper stacks", highlight=False)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "list":
            return _list()
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # generate()'s deprecation chatter is not for the user
        if args.command == "gate":
            return _gate(args)
        if args.command == "mutants":
            return _mutants(args)
        return _run(args)
    except UsageError as exc:
        print(f"lossless-check: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERNAL
    except Exception as exc:  # noqa: BLE001 - anything else is our bug: say so, keep the traceback
        import traceback

        traceback.print_exc()
        print(f"lossless-check: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
