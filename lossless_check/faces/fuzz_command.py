"""``lossless-check fuzz``: the CLI of :mod:`lossless_check.faces.fuzzing` (nothing heavy imported to build it)."""

from __future__ import annotations

from lossless_check.core.options import positive_int, probability


def add_fuzz_command(sub, default_scenario: str) -> None:
    """The ``fuzz`` subcommand of the CLI."""
    from lossless_check.faces.fuzzing import DEFAULT_ALPHA, DEFAULT_DATABASE, DEFAULT_EXAMPLES, DEFAULT_SAMPLES

    fuzz = sub.add_parser("fuzz", help="search for a warper stack a generator is not lossless under: a covering of "
                                       "every triple of warper options, then random stacks (hypothesis); prints the "
                                       "minimal one and its reproduce command")
    fuzz.add_argument("--generator", required=True, metavar="NAME|module:attr")
    fuzz.add_argument("--examples", type=positive_int, default=DEFAULT_EXAMPLES,
                      help="hypothesis examples of the random search in each pass (exact, then statistical), after "
                           f"the covering's stacks; vacuous ones do not count (default {DEFAULT_EXAMPLES})")
    fuzz.add_argument("--samples", type=positive_int, default=DEFAULT_SAMPLES,
                      help=f"trials per statistical example (default {DEFAULT_SAMPLES})")
    fuzz.add_argument("--scenario", default=default_scenario,
                      help=f"a fixed-logits scenario (default {default_scenario})")
    fuzz.add_argument("--alpha", type=probability, default=DEFAULT_ALPHA,
                      help="false-failure rate of the whole search, shrinking included (default 1e-6)")
    fuzz.add_argument("--seed", type=int, default=0,
                      help="seed of the search and of every check: the same seed checks the same stacks in the same "
                           "order, whatever else is imported (default 0)")
    fuzz.add_argument("--database", default=DEFAULT_DATABASE, metavar="DIR",
                      help="hypothesis example database: failing stacks are replayed first "
                           f"(default {DEFAULT_DATABASE})")
    fuzz.add_argument("--json", metavar="PATH", help="write the result (every stack checked) here")
    fuzz.add_argument("--quiet", action="store_true", help="no progress")
    fuzz.add_argument("--resume", action="store_true",
                      help="continue an interrupted search with the same arguments from the journal it keeps in "
                           "--database DIR; the result is the uninterrupted search's")


def fuzz_command(args) -> int:
    """Exit 0 when no stack was found that the generator is not lossless under (or raises under), 1 when
    one was. The installed verifier's state is reported beside the verdict (never deciding the exit code)."""
    import json
    import sys

    from lossless_check.faces.fuzzing import fuzz, journal_identity, journal_path
    from lossless_check.running.journal import EntryLog, write_atomically
    from lossless_check.running.progress import progress_reporter
    from lossless_check.outputs.report import beside_line
    from lossless_check.outputs.verifier_report import verifier_row

    identity = journal_identity(args.generator, args.examples, args.samples, args.scenario, args.seed, args.alpha)
    journal = EntryLog(journal_path(args.database, args.generator, args.scenario), identity, args.resume)
    if args.resume:
        print(f"lossless-check: resuming: {len({e['stack'] for e in journal.entries})} stacks checked, "
              f"{journal.chunks.count()} finished chunks of the next kept", file=sys.stderr)
    try:
        # No total, so no ETA: the search stops at its first failure, and shrinking adds tests of its own.
        with progress_reporter(None, args.quiet) as advance:
            result = fuzz(args.generator, args.examples, args.samples, args.scenario, args.seed, args.alpha,
                          args.database, advance, journal)
    except KeyboardInterrupt:
        print(f"lossless-check: interrupted: the stacks checked are kept in {journal.path}; the same command with "
              "--resume continues", file=sys.stderr)
        return 4
    journal.chunks.clear()  # the search is over: its records stay, no test is left midway
    verifier = verifier_row(args.scenario, subject=False)
    print(result.summary())
    print(beside_line(verifier))
    if args.json:
        write_atomically(args.json, json.dumps({**result.to_dict(), "verifier": verifier.to_dict()}, indent=2) + "\n")
    return result.exit_code
