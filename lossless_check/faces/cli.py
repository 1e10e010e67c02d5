"""``lossless-check`` command line: ``run``, ``gate``, ``verifier``, ``repro``, ``fuzz``, ``sweep``, ``bisect``,
``mutants``, ``models`` and ``list``.

Exit codes answer the question asked: 0 every subject lossless; 1 at least one subject not lossless,
or a generator error (a finding about the generator); 2 bad usage or input (one line); 3 the harness's
own bug; 4 interrupted (SIGINT or SIGTERM): the report holds every finished case, the rest
``unfinished``, and ``--resume`` continues; 5 no answer: nothing failed, but a subject was not checked
(every case of it skipped or vacuous) or a case is ``inconclusive`` (too little power for a pass), or
(``sweep``, ``bisect``) a release's run failed, reported so, never as a verdict. The subjects are the named generators; the installed verifier
is one only in ``verifier``, in a ``run`` without ``--generator`` (the whole install), or with
``--verifier-gates``; elsewhere its state is reported beside the generators' verdicts.

Arguments are checked before torch and transformers are imported, so bad usage fails at once.
"""

from __future__ import annotations

import argparse
import sys

from lossless_check.core.errors import UsageError
from lossless_check.core.exit_codes import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_NOT_LOSSLESS, EXIT_OK, EXIT_USAGE
from lossless_check.core.options import DEFAULT_ALPHA, DEFAULT_SAMPLES, positive_int, probability
from lossless_check.faces.coverage_option import add_coverage_dir_option, add_coverage_option
from lossless_check.faces.gate_command import max_detectable
from lossless_check.faces.on_release import add_release_option
from lossless_check.running.ray_backend import check_backend

DEFAULT_SCENARIO = "markov8"
SCENARIO_NAMES = ("markov8", "iid8", "iid32-fast-tokenizers", "iid32-id-ordered-vocab", "bpe-fast-tokenizers",
                  "bpe-id-ordered-vocab", "zipf32k", "markov8-bf16", "zipf32k-bf16", "zipf32k-fp16",
                  "iid8-padded-drafter", "lm49k", "markov8-linear", "markov8-hybrid", "markov8-sliding",
                  "markov8-static", "markov8-linear-full", "markov8-linear-sliding", "markov8-indexed",
                  "markov8-static-indexed", "tiny-llama", "markov8-seq2seq")
MATRICES = ("smoke", "default", "full")
#: Whether the gate measures coverage unless told not to: off, as it costs more than 15% of the gate's time
#: (side by side in benchmarks/coverage_table.py: 1.86 times on Python 3.11, whose tracer sees every line; the gate
#: guide recommends --coverage for a pull request that adds or changes a generator).
GATE_COVERAGE = False


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        raise UsageError(message)


def _common(parser: argparse.ArgumentParser, samples_help: str) -> None:
    parser.add_argument("--scenario", default=None,
                        help=f"{', '.join(SCENARIO_NAMES[:-2])} (fixed logits), tiny-llama (random 2-layer Llamas, "
                             f"generate mode only) or markov8-seq2seq (encoder-decoder stubs, generate and options "
                             f"modes); default {DEFAULT_SCENARIO}, and the default and full matrices add "
                             f"their real-world cases (zipf32k under top_p=0.9, iid32-fast-tokenizers)")
    parser.add_argument("--samples", type=positive_int, default=DEFAULT_SAMPLES, help=samples_help)
    parser.add_argument("--alpha", type=probability, default=DEFAULT_ALPHA,
                        help="family-wise false-failure rate of the run (default 1e-6)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of every case's random stream; changes the stream and nothing else (default 0)")
    parser.add_argument("--workers", type=positive_int, default=1,
                        help="worker processes, started once per run; results do not depend on it (default 1)")
    parser.add_argument("--fixed", action="store_true",
                        help="fixed-sample tests only: every case runs all --samples trials (default: sequential, "
                             "a case stops at the first trial its anytime e-value rejects)")
    parser.add_argument("--sequential", action="store_true", help=argparse.SUPPRESS)  # the default; kept for old scripts
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                        help="rows per real get_candidates call in step mode's batched arm; 1 runs every trial "
                             "at batch 1 (default 512)")
    parser.add_argument("--quiet", action="store_true", help="no progress")
    parser.add_argument("--torch-draws", action="store_true", help="every draw by torch's kernel: none by inverse CDF "
                        "(the verifier's draw at V >= 1,024, batched drafts; the same law; JSON substituted_draws)")
    parser.add_argument("--backend", choices=("local", "ray"), default="local",
                        help="where cases run: the local process pool (default), or Ray (pip install -e '.[ray]')")
    parser.add_argument("--address", default=None, metavar="HOST:PORT",
                        help="--backend ray: the cluster to join (default: a local Ray instance of --workers CPUs)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run with the same arguments from the journal kept beside its "
                             "report (run: --json PATH; gate: --out DIR); the result is the uninterrupted run's")
    parser.add_argument("--table", choices=("auto", "full", "summary"), default="auto",
                        help="the per-case table: full, summary (a line per generator and the failures only), or "
                             "auto: full up to 40 cases (default)")
    parser.add_argument("--no-verifier", action="store_true",
                        help="leave out the row of the exact check of the installed _speculative_sampling "
                             "(lossless-check verifier), which a run otherwise adds as its last row")
    parser.add_argument("--max-detectable-tv", type=probability, default=None, metavar="TV",
                        help="a case that rejects nothing reads lossless only if it would have detected a departure of "
                             "this total variation (power 0.99, at an informative position); else it is "
                             "inconclusive and the run exits 5 (default: --detect-tv where given, else 0.3)")
    parser.add_argument("--verifier-gates", action="store_true",
                        help="let the installed verifier's row decide the exit code too; by default it does only "
                             "in a run without --generator (the whole install), and with named generators it is "
                             "reported beside their verdicts (JSON \"subject\": false)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lossless-check", description="Statistical losslessness checks of speculative decoding.",
                     epilog="Exit codes: 0 every subject lossless, 1 a subject not lossless (or an error verdict), 2 bad "
                            "usage, 3 internal error, 4 interrupted (--resume continues), 5 no answer: a subject none "
                            "of whose cases was checked (all skipped, vacuous), an inconclusive case, or (sweep/bisect) "
                            "runs they aggregate failed. The subjects are the named generators; the installed "
                            "verifier is one in 'verifier', in 'run' without --generator, or with --verifier-gates, "
                            "and is otherwise reported beside them without deciding the exit code.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run losslessness checks (exit 1: a subject is not lossless; without "
                                     "--generator the whole install, the verifier included, is the subject)")
    run.add_argument("--generator", action="append", metavar="NAME|module:attr",
                     help="generator to check (repeatable; default: every built-in with an adapter)")
    run.add_argument("--warpers", action="append", metavar="k=v,k=v",
                     help="a warper stack as GenerationConfig kwargs (repeatable); 'none' for plain sampling")
    run.add_argument("--matrix", choices=MATRICES, default=None,
                     help="a named set of warper stacks (default when no --warpers: default)")
    run.add_argument("--mode", choices=("step", "provenance", "generate", "greedy", "options", "all"),
                     default="step",
                     help="step: statistical, one round (default); provenance: exact check of q; generate: the real "
                          "generate() loop; greedy: exact, do_sample=False against plain greedy decoding, a row per "
                          "generator (a step or all run over the whole install adds these rows); options: exact, "
                          "what generate() returns and streams beside the tokens (scores, logits, hidden states, "
                          "a streamer) and the heuristic draft schedule, a row per generator; all: step with "
                          "provenance beside it, plus generate")
    run.add_argument("--max-new-tokens", type=positive_int, default=4, metavar="K",
                     help="generate mode: tokens per generate() call, each position tested (default 4)")
    _common(run, f"trials per case (default {DEFAULT_SAMPLES})")
    add_release_option(run)
    run.add_argument("--detect-tv", type=probability, metavar="TV",
                     help="size the run: enough samples per case to detect this TV at position 1 with power 0.99")
    run.add_argument("--timeout", type=positive_int, default=600, metavar="S",
                     help="seconds a chunk of 1000 trials may take before its case is an error (default 600)")
    run.add_argument("--json", metavar="PATH", help="write the JSON report here")
    run.add_argument("--repro", metavar="DIR", help="write a standalone reproduction script for every failing case here")
    add_coverage_option(run, default=False)
    add_coverage_dir_option(run)
    from lossless_check.faces.sampler_command import add_sampler_options

    add_sampler_options(run, run=True)
    gate = sub.add_parser("gate", help="pre-merge gate: every mode that applies over a matrix; JSON, Markdown, HTML")
    gate.add_argument("--generator", required=True, metavar="NAME|module:attr")
    gate.add_argument("--out", default="lossless-gate", metavar="DIR", help="report directory (default lossless-gate)")
    gate.add_argument("--matrix", choices=MATRICES, default="default", help="warper stacks (default: default)")
    gate.add_argument("--generate-samples", type=positive_int, default=400, metavar="N",
                      help="trials per generate-mode case (the real loop, one sequence at a time; default 400)")
    gate.add_argument("--repro", metavar="DIR", help="write a standalone reproduction script for every failing case here")
    add_coverage_option(gate, default=GATE_COVERAGE)
    _common(gate, f"trials per case (default {DEFAULT_SAMPLES})")
    add_release_option(gate)
    repro = sub.add_parser("repro", help="write a standalone script (torch and transformers only) that runs one case "
                                         "through the real generate() and exits 1 when it is not lossless")
    repro.add_argument("--generator", required=True, metavar="NAME")
    repro.add_argument("--warpers", default="none", metavar="k=v,k=v", help="the warper stack (default none)")
    repro.add_argument("--scenario", default=DEFAULT_SCENARIO, help=f"a fixed-logits scenario (default {DEFAULT_SCENARIO})")
    repro.add_argument("--max-new-tokens", type=positive_int, default=4, metavar="K",
                       help="tokens per generate() call (default 4)")
    repro.add_argument("--samples", type=positive_int, default=None,
                       help="most generate() calls the script makes (default 1000; it stops at its first rejection)")
    repro.add_argument("--out", default="repro.py", metavar="PATH", help="where to write the script (default repro.py)")
    verifier = sub.add_parser("verifier", help="exact, white-box checks of the installed _speculative_sampling "
                                                "against the algorithm's law (exit 1 on a defect)")
    verifier.add_argument("--json", metavar="PATH", help="write the checks as JSON here")
    add_sampler_options(verifier, run=False)
    mutants = sub.add_parser("mutants", help="mutation self-test: every mutant of lossless_check.mutants "
                                            "(exit 1 unless each is judged right)")
    mutants.add_argument("--samples", type=positive_int, default=DEFAULT_SAMPLES, help="most trials per mutant")
    mutants.add_argument("--alpha", type=probability, default=DEFAULT_ALPHA)
    mutants.add_argument("--seed", type=int, default=0)
    mutants.add_argument("--json", metavar="PATH")
    from lossless_check.faces.history_command import add_history_commands

    add_history_commands(sub, MATRICES, DEFAULT_SCENARIO, DEFAULT_SAMPLES)
    from lossless_check.faces.fuzz_command import add_fuzz_command

    add_fuzz_command(sub, DEFAULT_SCENARIO)
    from lossless_check.faces.models_command import add_models_command

    add_models_command(sub)
    from lossless_check.faces.export_command import add_export_command

    add_export_command(sub)
    sub.add_parser("list", help="generators and the modes that apply on the installed transformers; scenarios; "
                                "warper catalog and matrices")
    return parser


def _precheck(args) -> None:
    """What can be checked without torch or transformers: generator names and warper syntax."""
    from lossless_check.laws.warpers import split_warpers
    from lossless_check.subjects.builtin import BUILTIN_GENERATORS

    for spec in ([args.generator] if isinstance(args.generator, str) else args.generator or []):
        if ":" not in spec.strip() and spec.strip() not in BUILTIN_GENERATORS:
            raise UsageError(f"unknown generator {spec.strip()!r}; known: {', '.join(sorted(BUILTIN_GENERATORS))} "
                             "(or module:attr)")
    warpers = getattr(args, "warpers", None) or []
    for spec in [warpers] if isinstance(warpers, str) else warpers:
        split_warpers(spec)
    if args.scenario is not None and args.scenario not in SCENARIO_NAMES:
        raise UsageError(f"unknown scenario {args.scenario!r}; known: {', '.join(SCENARIO_NAMES)}")
    if getattr(args, "verifier_gates", False) and getattr(args, "no_verifier", False):
        raise UsageError("--verifier-gates and --no-verifier contradict each other")
    _check_paths(args)
    check_backend(args)


def _check_paths(args) -> None:
    """Every path a command writes, checked before any work (a report lost after an hour is no report)."""
    from lossless_check.running.journal import check_writable_dir, check_writable_file

    if getattr(args, "json", None):
        check_writable_file(args.json, "--json")
    for option in ("out", "repro", "database"):  # fuzz keeps its journal in its --database
        if getattr(args, option, None) and args.command != "repro":
            check_writable_dir(getattr(args, option), f"--{option}")
    if args.command == "repro":
        check_writable_file(args.out, "--out")
    if getattr(args, "resume", False) and args.command == "run" and not args.json:
        raise UsageError("--resume needs the --json PATH of the interrupted run (its journal lies beside it)")


def _cases(args):
    from lossless_check.faces.api import cases_for
    from lossless_check.faces.sampler_command import loaded_sampler

    return cases_for(args.generator, args.warpers, args.matrix, args.mode, args.scenario, args.max_new_tokens,
                     loaded_sampler(args), args.torch_draws)


def _run(args) -> int:
    from lossless_check.faces.api import RunInterrupted, run_cases
    from lossless_check.faces.coverage_option import measured, report_coverage
    from lossless_check.modes.sample_size import samples_to_detect
    from lossless_check.outputs.report import print_table, write_json
    from lossless_check.running.journal import Journal, journal_for, run_identity
    from lossless_check.running.progress import progress_reporter

    cases = _cases(args)
    sequential = not args.fixed
    if args.detect_tv is not None:
        args.samples = samples_to_detect(cases, args.detect_tv, args.alpha, args.max_new_tokens, sequential)
    journal = None
    if args.json:
        identity = run_identity(cases, args.samples, args.alpha, args.seed, sequential, args.batch_size)
        journal = Journal(journal_for(args.json), identity, args.resume)
        if args.resume:
            print(f"lossless-check: resuming: {journal.kept()}", file=sys.stderr)
    try:
        with progress_reporter(len(cases) - len(journal.done if journal else ()), args.quiet) as advance, \
                measured(args.generator or (), args.coverage) as measurement:
            result = run_cases(cases, args.samples, args.alpha, args.seed, args.workers, advance, sequential,
                               args.timeout, args.batch_size, journal=journal, backend=args.backend,
                               address=args.address, verifier=not args.no_verifier,
                               verifier_gates=args.verifier_gates or not args.generator,
                               **max_detectable(args))
    except RunInterrupted as stopped:
        from lossless_check.faces.gate_command import interrupted

        return interrupted(stopped.partial, args.json, args.table)
    print_table(result, table=args.table)
    report_coverage(measurement, args.coverage_dir)
    if args.json:
        write_json(result, args.json)
    if args.repro:
        from lossless_check.outputs.repro import write_repros

        print("\n".join(write_repros(cases, result.cases, args.repro)))
    return result.exit_code


def _repro(args) -> int:
    from lossless_check.faces.api import cases_for
    from lossless_check.outputs.repro import write_repro

    [case] = cases_for(args.generator, args.warpers, None, "generate", args.scenario, args.max_new_tokens)
    written = write_repro(case, args.out, samples=args.samples)
    print(f"wrote {written}: run it with python (exit 1: not lossless, or generate() raised)")
    return EXIT_OK


def _verifier(args) -> int:
    """Exit 0 when the installed verifier (or ``--sampler``) passes every check, 1 on a defect."""
    if args.sampler is not None:
        from lossless_check.faces.sampler_command import sampler_command

        return sampler_command(args)
    from lossless_check.outputs.verifier_report import print_verifier, write_verifier_json
    from lossless_check.subjects.verifier import verify

    report = verify()
    print_verifier(report)
    if args.json:
        write_verifier_json(report, args.json)
    return EXIT_OK if report.clean else EXIT_NOT_LOSSLESS


def _mutants(args) -> int:
    """Exit 0 when every bug mutant is caught and every equivalent one passes, else 1."""
    import json

    from rich.console import Console

    from lossless_check.faces.mutation import mutation_report, print_mutation_report

    rows = mutation_report(args.samples, args.seed, args.alpha)
    print_mutation_report(rows, Console(width=None if sys.stdout.isatty() else 200))
    if args.json:
        from lossless_check.running.journal import write_atomically

        write_atomically(args.json, json.dumps([{k: v for k, v in row.items() if k != "positions"} for row in rows],
                                               indent=2))
    ran = [row["correct"] for row in rows if row["correct"] is not None]  # None: not on this release
    return EXIT_OK if ran and all(ran) else EXIT_NOT_LOSSLESS


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
        if args.command in ("run", "gate", "repro", "fuzz"):
            _precheck(args)
        elif args.command in ("mutants", "verifier"):
            _check_paths(args)
        if args.command in ("run", "verifier"):
            from lossless_check.faces.sampler_command import precheck_sampler

            precheck_sampler(args)
        elif args.command == "models":
            from lossless_check.faces.models_command import precheck_models

            precheck_models(args)
        elif args.command in ("sweep", "bisect"):
            from lossless_check.faces.history_command import check_history_paths

            check_history_paths(args, _precheck)
        if args.command in ("run", "gate", "fuzz", "sweep", "models"):
            import signal

            # A CI time-out or a pre-empted node sends SIGTERM: stop as for Ctrl-C, keeping what finished.
            signal.signal(signal.SIGTERM, signal.default_int_handler)
        if getattr(args, "transformers", None):
            from lossless_check.faces.on_release import run_on_release

            code = run_on_release(args.transformers, argv)
            if code is not None:
                return code
        if args.command == "list":
            from lossless_check.outputs.listing import print_listing

            return print_listing()
        from transformers.utils import logging as hf_logging

        # What transformers still logs comes from its own generators calling generate() (a config plus
        # kwargs, a processor passed twice), not from anything the user passed: not for the user.
        hf_logging.set_verbosity_error()
        if args.command == "gate":
            from lossless_check.faces.gate_command import gate_command

            return gate_command(args)
        if args.command == "mutants":
            return _mutants(args)
        if args.command == "verifier":
            return _verifier(args)
        if args.command == "repro":
            return _repro(args)
        if args.command in ("sweep", "bisect"):
            from lossless_check.faces.history_command import history_command

            return history_command(args)
        if args.command == "fuzz":
            from lossless_check.faces.fuzz_command import fuzz_command

            return fuzz_command(args)
        if args.command == "models":
            from lossless_check.faces.models_command import models_command

            return models_command(args)
        if args.command == "export-tests":
            from lossless_check.faces.export_command import export_command

            return export_command(args)
        return _run(args)
    except UsageError as exc:
        print(f"lossless-check: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("lossless-check: interrupted before any case finished", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - anything else is our bug: say so, keep the traceback
        import traceback

        traceback.print_exc()
        print(f"lossless-check: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
