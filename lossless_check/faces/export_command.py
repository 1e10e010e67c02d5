"""The ``export-tests`` command: write pytest modules that transformers can adopt (see docs/guides/export-tests.md)."""

from __future__ import annotations

from lossless_check.core.exit_codes import EXIT_OK


def add_export_command(sub) -> None:
    """Add ``export-tests --out DIR`` to the CLI's subcommands."""
    export = sub.add_parser("export-tests", help="write self-contained pytest modules (torch, transformers, pytest, "
                                                 "numpy, scipy only) testing the installed release's generators")
    export.add_argument("--out", required=True, metavar="DIR",
                        help="directory to write the modules into (created; the modules it holds are rewritten, and those of "
                             "families the installed release lacks removed)")


def export_command(args) -> int:
    """Write the modules and say what they test and how to run them."""
    from lossless_check.outputs.export_tests import export_tests

    export = export_tests(args.out)
    print(f"wrote {len(export.files)} files to {args.out}: {', '.join(p.name for p in export.files)}")
    print(f"generators tested: {', '.join(export.generators) or 'none (the verifier only)'}; the verifier: "
          f"_speculative_sampling; {export.law_tests} law tests, false-failure rate <= 1e-6 for all together")
    print(f"run: python -m pytest {args.out}")
    return EXIT_OK
