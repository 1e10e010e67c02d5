"""The verifier check's outputs: its table, its JSON, and its row in a run (:func:`verifier_row`)."""

from __future__ import annotations

import json
from pathlib import Path

from lossless_check.evidence.results import CaseResult
from lossless_check.subjects.verifier import ZERO_RATE, VerifierReport, verify

#: The row's generator and mode in a run's table and JSON.
VERIFIER_NAME = "_speculative_sampling"
VERIFIER_MODE = "verifier"
#: Where upstream stands on the installed verifier's known defect: ``r_i <= p/q`` (4.37.0-5.24.0);
#: 5.25.0 compares with ``<`` (``findings/verifier_accepts_zero_probability``).
KNOWN_DEFECT = ("`r_i <= p/q` accepts drafts of target probability 0 (4.37.0-5.24.0); fixed upstream in 5.25.0 "
                "(`r_i < p/q`)")


def print_verifier(report: VerifierReport, console=None) -> None:
    """The checks as a table, then the defect (file, line, rate) or that the verifier is clean."""
    import sys

    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=None if sys.stdout.isatty() else 200)
    table = Table(title=f"lossless-check verifier  transformers {report.transformers_version}  {report.source}",
                  title_justify="left")
    for column in ("check", "law", "expected", "installed", "result"):
        table.add_column(column, overflow="fold")
    for c in report.premises + report.checks:
        mark = "[green]pass[/]" if c.passed else "[bold red]FAIL[/]"
        table.add_row(c.name, c.law, c.expected, c.observed, mark)
    console.print(table)
    for d in report.defects:
        console.print(f"[bold red]defect[/] {d['file']}:{d['line']}: `{d['source']}`: {len(d['checks'])} checks fail; "
                      + "; ".join(d["rates"] + [upstream_status(d)]), highlight=False)
    if report.clean:
        console.print(f"the installed _speculative_sampling follows the algorithm's law in all {len(report.checks)} "
                      f"checks", highlight=False)


def write_verifier_json(report: VerifierReport, path: str | Path) -> None:
    from lossless_check.running.journal import write_atomically

    write_atomically(path, json.dumps(report.to_dict(), indent=2) + "\n")


def upstream_status(defect: dict) -> str:
    """What is known upstream of a defect of :func:`~lossless_check.subjects.verifier.verify` (its line's comparison)."""
    if "<=" in defect["source"]:
        return KNOWN_DEFECT
    return "not a known upstream defect: worth reporting to transformers"


def verifier_row(scenario: str, report: VerifierReport | None = None, subject: bool = True) -> CaseResult:
    """The verifier as one row of a run: exact (no share of alpha, outside Holm: its ``p_value`` is None).

    ``subject=False``: the run's subjects are named generators; the row is reported beside them and
    does not decide the exit code (:attr:`~lossless_check.evidence.results.RunResult.beside`)."""
    report = report or verify()
    failing = [c for c in report.checks if not c.passed]
    row = CaseResult(VERIFIER_NAME, "-", VERIFIER_MODE, scenario, samples=0,
                     verdict="not_lossless" if failing else "lossless", exact_failure=bool(failing),
                     failed_checks=[c.name for c in failing],
                     exact_failures=[{"check": c.name, "cause": "verifier", "rate": c.rate} for c in failing],
                     subject=subject)
    if failing:
        d = report.defects[0]
        rates = sorted(d["rates"], key=lambda rate: rate != ZERO_RATE)  # the exact failure's rate first
        row.reason = (f"{d['file']}:{d['line']} `{d['source']}`: {len(failing)} of {len(report.checks)} exact checks "
                      f"fail ({failing[0].name}, ...); {rates[0] if rates else ''}; {upstream_status(d)} "
                      "(details: lossless-check verifier)")
    else:
        row.reason = f"all {len(report.checks)} exact checks of the installed verifier pass (lossless-check verifier)"
    return row
