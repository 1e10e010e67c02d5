"""``lossless-check gate`` on the command line, and what an interrupted ``run`` or ``gate`` says."""

from __future__ import annotations

import sys

from lossless_check.core.exit_codes import EXIT_INTERRUPTED, EXIT_NOT_LOSSLESS, EXIT_OK


def max_detectable(args) -> dict:
    """``max_detectable_tv``: ``--max-detectable-tv``, else ``--detect-tv`` (the size the run was made to
    detect is the size its passes claim), else the library's default."""
    bar = args.max_detectable_tv if args.max_detectable_tv is not None else getattr(args, "detect_tv", None)
    return {} if bar is None else {"max_detectable_tv": bar}


def gate_command(args) -> int:
    """``lossless-check gate``: run the gate, print its table and where its reports are; the exit code."""
    import json
    from pathlib import Path

    from rich.console import Console

    from lossless_check.faces.api import RunInterrupted
    from lossless_check.faces.gate import gate
    from lossless_check.running.progress import progress_reporter

    try:
        with progress_reporter(None, args.quiet) as advance:
            result, code = gate(args.generator, args.out, matrix_name=args.matrix, samples=args.samples,
                                alpha=args.alpha, seed=args.seed, scenario=args.scenario, workers=args.workers,
                                sequential=not args.fixed, progress=advance, batch_size=args.batch_size,
                                return_result=True, generate_samples=args.generate_samples, repro_dir=args.repro,
                                resume=args.resume, backend=args.backend, address=args.address,
                                verifier=not args.no_verifier, verifier_gates=args.verifier_gates,
                                coverage=args.coverage, torch_draws=args.torch_draws, **max_detectable(args))
    except RunInterrupted as stopped:
        return interrupted(stopped.partial, str(Path(args.out) / "report.json"), args.table)
    from lossless_check.outputs.report import print_table

    print_table(result, table=args.table)
    reports = ", ".join(str(Path(args.out) / name) for name in ("report.json", "report.md", "report.html"))
    if args.coverage:
        from lossless_check.outputs.coverage_report import COVERAGE_NAMES

        print(json.loads((Path(args.out) / "report.json").read_text())["coverage"]["headline"])
        reports += ", " + ", ".join(str(Path(args.out) / name) for name in COVERAGE_NAMES)
    said = {EXIT_OK: "passed", EXIT_NOT_LOSSLESS: "failed"}.get(code, "gave no answer")
    Console(soft_wrap=True).print(f"gate {said} (exit {code}); reports: {reports}", highlight=False)
    return code


def interrupted(partial, json_path, table: str) -> int:
    """Report what an interrupted run finished, and how to go on."""
    from lossless_check.outputs.report import print_table, write_json

    print_table(partial, table=table)
    if json_path:
        write_json(partial, json_path)
    kept = f" and are in {json_path} (the finished chunks of the others beside it)" if json_path else ""
    print(f"lossless-check: interrupted: {sum(c.verdict != 'unfinished' for c in partial.cases)} of "
          f"{len(partial.cases)} cases finished{kept}; the same command with --resume continues", file=sys.stderr)
    return EXIT_INTERRUPTED
