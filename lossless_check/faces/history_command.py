"""The ``sweep`` and ``bisect`` commands: their arguments, the paths they write, and their exit codes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lossless_check.history.bisect import bisect, case_verdict
from lossless_check.history.sweep import FIRST_SUPPORTED, compat_table, parse_releases, sweep

ENVS_HELP = ("where release environments are kept (default $LOSSLESS_CHECK_ENVS, else "
             "~/.cache/lossless-check/envs)")


NO_ANSWER_HELP = ("Exit codes: 0 every run looked at gave a verdict (bisect: the change, or that there is none); 5 no "
                  "answer: a release whose run failed (an environment that could not be built, another exit than 0 "
                  "or 1, no report, an interrupted one) is reported as failed with its reason, never read as a "
                  "verdict; 2 bad usage; 3 internal error.")


def add_history_commands(sub, matrices, default_scenario: str, default_samples: int) -> None:
    """The ``sweep`` and ``bisect`` subcommands of the CLI."""
    from lossless_check.core.options import positive_int

    sweep = sub.add_parser("sweep", help="the compat table: a run per release and mode, each release in its own "
                                         "cached environment", epilog=NO_ANSWER_HELP)
    sweep.add_argument("--releases", required=True, metavar="SPEC",
                       help=f"all (since {FIRST_SUPPORTED}: the newest patch of each minor, plus older patches "
                            "whose generation code a later patch changed), every (every release since "
                            f"{FIRST_SUPPORTED}), A..B (every release from A to B), or A,B,...")
    sweep.add_argument("--modes", nargs="+", default=["step", "generate", "provenance"],
                       choices=["step", "generate", "provenance"])
    sweep.add_argument("--matrix", choices=matrices, default="smoke")
    sweep.add_argument("--samples", type=positive_int, default=1000, help="trials per case (default 1000)")
    sweep.add_argument("--generate-samples", type=positive_int, default=300,
                       help="trials per generate-mode case (default 300)")
    sweep.add_argument("--seed", type=int, default=0)
    sweep.add_argument("--envs", default=None, metavar="DIR", help=ENVS_HELP)
    sweep.add_argument("--work", default="lossless-sweep", metavar="DIR", help="each release's JSON reports")
    sweep.add_argument("--out", default="compat_table.md", metavar="PATH", help="the table (Markdown)")
    sweep.add_argument("--reuse", action="store_true",
                       help="keep a release's reports in --work when each is a finished run of these arguments "
                            "(release, seed, samples, the matrix's stacks), e.g. after an interrupted sweep; delete "
                            "the reports of releases whose results this checkout would change")
    sweep.add_argument("--resume", action="store_true",
                       help="continue an interrupted sweep with the same arguments: --reuse, and each release's run "
                            "that was cut short goes on from the finished cases and chunks its journal in --work keeps")
    sweep.add_argument("--timeout", type=positive_int, default=1800, metavar="S", help="seconds per release and mode")
    sweep.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="where releases run: one after another here (default), or a Ray task per release")
    sweep.add_argument("--address", default=None, metavar="HOST:PORT",
                       help="--backend ray: the cluster to join (default: a local Ray instance of --workers CPUs)")
    sweep.add_argument("--workers", type=positive_int, default=1,
                       help="releases run at once without --address (default 1: one after another)")
    bisect = sub.add_parser("bisect", help="the first release in a range where one case's verdict changes",
                            epilog=NO_ANSWER_HELP)
    bisect.add_argument("--generator", required=True, metavar="NAME|module:attr")
    bisect.add_argument("--warpers", default="none", metavar="k=v,k=v")
    bisect.add_argument("--releases", required=True, metavar="A..B")
    bisect.add_argument("--mode", choices=("step", "provenance", "generate"), default="step")
    bisect.add_argument("--scenario", default=default_scenario)
    bisect.add_argument("--samples", type=positive_int, default=default_samples)
    bisect.add_argument("--seed", type=int, default=0)
    bisect.add_argument("--envs", default=None, metavar="DIR", help=ENVS_HELP)
    bisect.add_argument("--work", default="lossless-bisect", metavar="DIR", help="each release's JSON report")


def check_history_paths(args, precheck) -> None:
    """The paths ``sweep`` and ``bisect`` write, and ``bisect``'s case, checked before any work."""
    from lossless_check.running.journal import check_writable_dir, check_writable_file

    check_writable_dir(args.work, "--work")
    if args.envs:
        check_writable_dir(args.envs, "--envs")
    if args.command == "sweep":
        from lossless_check.running.ray_backend import check_backend

        check_writable_file(args.out, "--out")
        check_backend(args)
    else:
        precheck(argparse.Namespace(generator=[args.generator], warpers=[args.warpers], scenario=args.scenario,
                                     command="bisect"))


def history_command(args) -> int:
    """``sweep``: the compat table (exit 0; 5 when a release and mode gave no verdict, each named with
    its reason on stderr and ``failed`` in the table); ``bisect``: the first release where the verdict
    changes, or that none does (exit 0), or no answer (exit 5) when the probes that would decide failed.
    Relative paths are this directory's: they are resolved before anything runs elsewhere."""
    from lossless_check.core.exit_codes import EXIT_NO_ANSWER, EXIT_OK

    envs = Path(args.envs).resolve() if args.envs else None
    work = Path(args.work).resolve()
    releases = parse_releases(args.releases)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.command == "sweep":
        run_args = {mode: ["run", "--matrix", args.matrix, "--mode", mode, "--seed", str(args.seed), "--samples",
                           str(args.generate_samples if mode == "generate" else args.samples)] for mode in args.modes}
        reuse = None
        if args.reuse or args.resume:
            from lossless_check.laws.matrix import matrix
            from lossless_check.laws.warpers import format_warpers

            reuse = {format_warpers(stack) for stack in matrix(args.matrix)}
        try:
            results = sweep(releases, args.modes, run_args, work, envs, args.timeout, say, args.backend,
                            args.address, args.workers, reuse, args.resume)
        except KeyboardInterrupt:
            print(f"lossless-check: interrupted: each finished release's reports, and the journal of each run cut "
                  f"short, are in {work}; the same command with --resume continues", file=sys.stderr)
            return 4
        command = "lossless-check " + " ".join(sys.argv[1:])
        from lossless_check.running.journal import write_atomically

        write_atomically(args.out, compat_table(results, args.modes, command, run_args))
        failed = [f"{r} {m}: {res[m]['failed']}" for r, res in results.items() for m in args.modes if "failed" in res[m]]
        for line in failed:
            say(f"FAILED {line}")
        runs = len(releases) * len(args.modes)
        print(f"wrote {args.out} ({len(releases)} releases x {len(args.modes)} modes"
              + (f"; no verdict from {len(failed)} of {runs} runs: their cells read failed)" if failed else ")"))
        return EXIT_NO_ANSWER if failed else EXIT_OK
    case = ["run", "--generator", args.generator, "--warpers", args.warpers, "--mode", args.mode, "--scenario",
            args.scenario, "--samples", str(args.samples), "--seed", str(args.seed), "--no-verifier"]
    found = bisect(lambda release: case_verdict(release, case, work, envs, say=say), releases)
    looked = ", ".join(f"{r} {found.seen[r]}" for r in releases if r in found.seen)
    if found.no_answer:
        print(f"no answer: {found.no_answer}; looked at {looked}")
        return EXIT_NO_ANSWER
    if found.first is None:
        print(f"no change in {releases[0]}..{releases[-1]}: {looked}")
    else:
        print(f"{found.first}: first release where the verdict changes; looked at {looked}")
    return EXIT_OK
