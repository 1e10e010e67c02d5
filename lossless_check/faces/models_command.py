"""``lossless-check models``: the CLI of :mod:`lossless_check.faces.models` (nothing heavy imported to build it)."""

from __future__ import annotations

from lossless_check.core.options import DEFAULT_ALPHA, positive_int, probability
from lossless_check.faces.coverage_option import add_coverage_dir_option, add_coverage_option
from lossless_check.faces.on_release import add_release_option


def add_models_command(sub) -> None:
    """The ``models`` subcommand of the CLI."""
    models = sub.add_parser("models", help="check speculative decoding with your own target/assistant checkpoints "
                                           "(exact q provenance, a statistical test per emitted token, greedy "
                                           "equivalence; exit 1: not lossless)")
    models.add_argument("--target", required=True, metavar="DIR", help="the target's save_pretrained folder")
    models.add_argument("--assistant", required=True, metavar="DIR", help="the assistant's save_pretrained folder")
    models.add_argument("--generator", action="append", metavar="NAME|module:attr",
                        help="generator to check (repeatable; default AssistedCandidateGenerator and "
                             "PromptLookupCandidateGenerator)")
    models.add_argument("--warpers", action="append", metavar="k=v,k=v",
                        help="a warper stack (repeatable; 'none' for plain sampling; default top_k=50)")
    models.add_argument("--prompts", metavar="FILE", help="one prompt per line: text (tokenized by the target's "
                                                          "tokenizer) or token ids; default 8 seeded random prompts")
    models.add_argument("--max-new-tokens", type=positive_int, default=32, metavar="K",
                        help="tokens per generate() call (default 32)")
    models.add_argument("--samples", type=positive_int, default=64, metavar="N",
                        help="most sampling generate() calls per generator and stack; stops at a rejection "
                             "(default 64)")
    models.add_argument("--alpha", type=probability, default=DEFAULT_ALPHA,
                        help="family-wise false-failure rate (default 1e-6)")
    models.add_argument("--seed", type=int, default=0)
    models.add_argument("--device", default="cpu", help="torch device of both models (default cpu)")
    models.add_argument("--workers", type=positive_int, default=1, metavar="W",
                        help="processes the sampling calls are spread over, each loading the pair (default 1; "
                             "the same seed gives the same report for any W)")
    models.add_argument("--json", metavar="PATH", help="write the report here")
    add_coverage_option(models, default=False)
    add_coverage_dir_option(models)
    add_release_option(models)


def precheck_models(args) -> None:
    """Paths, generator names and warper syntax, before torch is imported."""
    from lossless_check.running.journal import check_writable_file
    from lossless_check.modes.models.loading import check_checkpoint_dir, check_prompts_file
    from lossless_check.laws.warpers import split_warpers

    check_checkpoint_dir(args.target, "--target")
    check_checkpoint_dir(args.assistant, "--assistant")
    check_prompts_file(args.prompts)
    for spec in args.warpers or []:
        split_warpers(spec)
    if args.json:
        check_writable_file(args.json, "--json")


def models_command(args) -> int:
    """Exit 0 when every row is lossless (or skipped), 1 when one is not lossless or errs."""
    import json

    from lossless_check.faces.coverage_option import measured, report_coverage
    from lossless_check.faces.models import check_models
    from lossless_check.running.journal import write_atomically

    with measured(args.generator or (), args.coverage) as measurement:
        result = check_models(args.target, args.assistant, args.generator, args.warpers, args.prompts,
                              args.max_new_tokens, args.samples, args.alpha, args.seed, args.device, args.workers)
    print(result.table())
    report_coverage(measurement, args.coverage_dir, list(dict.fromkeys(r.generator.rpartition(":")[2]
                                                                        for r in result.rows)))
    if args.json:
        write_atomically(args.json, json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    return result.exit_code


def reproduce_models_command(result) -> str:
    """The ``lossless-check models`` command that repeats a :class:`~lossless_check.faces.models.ModelsResult`:
    the same pair, generators, stacks, prompts, seed and alpha, so the same data and verdicts."""
    import shlex

    s = result.settings
    args = ["lossless-check", "models", "--target", s["target"], "--assistant", s["assistant"]]
    for spec in s.get("generators") or []:
        args += ["--generator", spec]
    for stack in dict.fromkeys(r.warpers for r in result.rows):
        args += ["--warpers", stack]
    if s["prompts"] != "built-in":
        args += ["--prompts", s["prompts"]]
    args += ["--max-new-tokens", str(s["max_new_tokens"]), "--samples", str(s["samples"]), "--seed",
             str(result.seed), "--alpha", repr(result.alpha), "--device", s["device"]]
    return shlex.join(args)


def models_record(row, result, test: str, check: int, command: str) -> dict:
    """One row of a plugin's models check as a ``--lossless-report`` case (``mode`` ``models``): the row's
    JSON, the report's case keys that mean nothing here set to ``None``, and the plugin's keys."""
    return {"scenario": None, "tv": None, "tv_detectable": None, "p_value": None, "acceptance_rate": None,
            "expected_acceptance_rate": None, **row.to_dict(), "alpha_case": result.alpha,
            "target": result.settings["target"], "assistant": result.settings["assistant"], "test": test,
            "check": check, "generator_spec": row.generator, "reproduce": command}


def models_failure_message(result, command: str) -> str:
    """Why a models check is not a pass: every row that is not lossless (failing, inconclusive, not checked),
    with what it found, then the command."""
    s = result.settings
    said = "is not lossless" if result.exit_code == 1 else "gave no answer (nothing failed, but not every row passed)"
    lines = [f"the pair target {s['target']} / assistant {s['assistant']} {said} "
             f"(alpha {result.alpha:.3g}, seed {result.seed})"]
    for row in result.rows:
        if row.verdict != "lossless":
            lines.append(f"  {row.verdict} {row.generator} [{row.warpers}]: {row.reason}")
    lines.append(f"reproduce: {command}")
    return "\n".join(lines)
