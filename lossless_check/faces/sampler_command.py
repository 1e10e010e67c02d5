"""``--sampler`` on the command line: ``verifier --sampler`` checks a user's rejection sampler, ``run --sampler``
puts it in place of the installed ``_speculative_sampling`` (nothing heavy imported to build the parser)."""

from __future__ import annotations

import shlex

from lossless_check.core.errors import UsageError
from lossless_check.core.options import SAMPLER_PROTOCOLS, positive_int, probability

#: Trials per draft/target pair of the statistical check.
DEFAULT_PAIR_SAMPLES = 5_000


def add_sampler_options(parser, run: bool) -> None:
    """``--sampler`` and ``--protocol``; on ``verifier`` also the statistical check's options."""
    what = ("run it in place of the installed _speculative_sampling in every step and generate case (the "
            "real generate() loop included), and add its own check as the last row" if run else
            "check this rejection sampler instead of the installed _speculative_sampling: exactly where its "
            "draws go through the torch primitives the check controls, statistically always")
    parser.add_argument("--sampler", metavar="module:function", help=what)
    parser.add_argument("--protocol", choices=SAMPLER_PROTOCOLS, default=None,
                        help="the sampler's protocol: transformers (_speculative_sampling's signature) or probs "
                             "(draft_probs, draft_token_ids, target_probs) -> emitted ids; default: read from its "
                             "signature")
    if run:
        return
    parser.add_argument("--samples", type=positive_int, default=None,
                        help=f"--sampler: trials per draft/target pair of the statistical check "
                             f"(default {DEFAULT_PAIR_SAMPLES})")
    parser.add_argument("--alpha", type=probability, default=None,
                        help="--sampler: family-wise false-failure rate of the statistical check (default 1e-6)")
    parser.add_argument("--seed", type=int, default=None,
                        help="--sampler: seed of the statistical check's pairs and trials (default 0)")


def precheck_sampler(args) -> None:
    """Options that need ``--sampler``, refused without it, and modes that never call a sampler (one line,
    before any work)."""
    if args.sampler is not None:
        if getattr(args, "mode", None) in ("greedy", "provenance"):
            raise UsageError(f"--sampler needs a mode that calls _speculative_sampling (step, generate or all); "
                             f"{args.mode} mode never does")
        return
    given = [f"--{name}" for name in ("protocol", "samples", "alpha", "seed")
             if getattr(args, name, None) is not None and (args.command == "verifier" or name == "protocol")]
    if given:
        raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --sampler")


def loaded_sampler(args):
    """The sampler of ``--sampler`` (and ``--protocol``), or ``None``; a bad one is a one-line usage error."""
    if args.sampler is None:
        return None
    from lossless_check.subjects.sampler import load_sampler

    return load_sampler(args.sampler, args.protocol)


def sampler_command(args) -> int:
    """``verifier --sampler``: exit 0 when the sampler is lossless, 1 when not."""
    from lossless_check.core.exit_codes import EXIT_NOT_LOSSLESS, EXIT_OK
    from lossless_check.faces.api import check_sampler
    from lossless_check.outputs.sampler_report import print_sampler, write_sampler_json

    report = check_sampler(loaded_sampler(args), samples=args.samples or DEFAULT_PAIR_SAMPLES,
                           alpha=1e-6 if args.alpha is None else args.alpha, seed=args.seed or 0)
    print_sampler(report)
    if args.json:
        write_sampler_json(report, args.json)
    return EXIT_OK if report.lossless else EXIT_NOT_LOSSLESS


def reproduce_sampler_command(report, samples: int, alpha: float, seed: int) -> str:
    """The ``lossless-check verifier --sampler`` command that repeats a check: same data, same verdict."""
    return shlex.join(["lossless-check", "verifier", "--sampler", report.sampler, "--protocol", report.protocol,
                       "--samples", str(samples), "--alpha", repr(alpha), "--seed", str(seed)])


def sampler_record(report, test: str, check: int, alpha: float, seed: int) -> dict:
    """A sampler check as a ``--lossless-report`` case (``mode`` ``sampler``): the report's case keys where they
    mean something (``tv_detectable``: position 1's, worst pair; ``p_value``: the statistical part's), the
    check's own (``protocol``, ``exact``) and the plugin's (``test``, ``check``, ``reproduce``)."""
    stats = report.statistical
    exact = "fails" if report.exact.failed else "passes" if report.exact.traced else "not enumerable"
    return {"generator": report.sampler, "warpers": "-", "mode": "sampler", "scenario": "-", "verdict": report.verdict,
            "samples": stats.samples, "tv": None, "tv_detectable": stats.tv_detectable, "p_value": stats.p_value,
            "acceptance_rate": None, "expected_acceptance_rate": None, "reason": report.reason, "alpha_case": alpha,
            "protocol": report.protocol, "exact": exact, "test": test, "check": check,
            "generator_spec": report.sampler,
            "reproduce": reproduce_sampler_command(report, stats.samples, alpha, seed)}
