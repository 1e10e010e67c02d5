"""A user's sampler check, printed (``lossless-check verifier --sampler``), as JSON, and as a run's row."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lossless_check.evidence.results import CaseResult
from lossless_check.subjects.sampler_check import SamplerReport
from lossless_check.subjects.sampler_exact import NOT_ENUMERABLE

#: The mode of a sampler's row in a run (the verifier's mode: exact where it can be, outside the cases).
SAMPLER_MODE = "verifier"


def print_sampler(report: SamplerReport, console=None) -> None:
    """The exact checks (one per design) as a table, the statistical tests that reject, then the verdict."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(width=None if sys.stdout.isatty() else 200, emoji=False)
    table = Table(title=f"lossless-check verifier --sampler {report.sampler}  ({report.protocol} protocol)  "
                        f"transformers {report.transformers_version}", title_justify="left")
    for column in ("check", "laws", "expected", "sampler", "result"):
        table.add_column(column, overflow="fold")
    for c in report.premises + report.exact.checks:
        mark = ("[green]pass[/]" if c.passed else "[yellow]not enumerable[/]" if c.observed.startswith(NOT_ENUMERABLE)
                else "[bold red]FAIL[/]")
        table.add_row(*(escape(text) for text in (c.name, c.law.split(": given")[0], c.expected,
                                                  c.observed + (f" ({c.rate})" if c.rate else ""))), mark)
    console.print(table)
    stats = report.statistical
    for failure in stats.exact_failures:
        console.print(f"[bold red]statistical run, exact failure[/] {escape(failure)}", highlight=False, emoji=False)
    for t in stats.rejected:
        console.print(f"[bold red]rejects[/] {escape(t.design)}, position {t.position}: TV {t.tv:.4f} (n={t.samples}, "
                      f"Holm-adjusted p={t.p_value_adjusted:.2g}; {'+'.join(t.rejected_by)})", highlight=False)
    style = "green" if report.lossless else "bold red"
    console.print(f"[{style}]{report.verdict}[/] {escape(report.sampler)}: {escape(report.reason)}", highlight=False,
                  emoji=False)


def write_sampler_json(report: SamplerReport, path: str | Path) -> None:
    from lossless_check.running.journal import write_atomically

    write_atomically(path, json.dumps(report.to_dict(), indent=2) + "\n")


def sampler_row(report: SamplerReport, scenario: str) -> CaseResult:
    """The sampler as the last row of a run whose cases ran with it in place of the installed verifier.

    Its exact part stands outside Holm (an exact failure fails the row whatever the rest says); its
    statistical part is a p-value in the run's Holm family (the smallest Holm-adjusted p-value of its own
    tests: valid for "some position test rejects"), so the run's family rate covers it."""
    stats = report.statistical
    row = CaseResult(report.sampler, "-", SAMPLER_MODE, scenario, samples=stats.samples,
                     verdict=report.verdict, exact_failure=report.exact_failure, p_value=stats.p_value,
                     tv_detectable=stats.tv_detectable, failed_checks=[c.name for c in report.exact.failed],
                     exact_failures=[{"check": c.name, "cause": "sampler", "rate": c.rate}
                                     for c in report.exact.failed]
                     + [{"check": "support", "cause": "sampler", "where": f} for f in stats.exact_failures])
    row.sampler = report.sampler
    row.reason = (f"replaced the installed _speculative_sampling in every case of this run ({report.protocol} "
                  f"protocol); {report.reason}")
    return row


def blame_sampler(result: CaseResult, sampler: str) -> None:
    """A case that ran with ``sampler`` in place of the installed verifier: the trials where the verifier
    accepted a draft of target probability 0 (set aside as the installed verifier's doing, see
    :mod:`~lossless_check.evidence.attribution`) are the sampler's, and the sampler is what the run checks
    end to end: they are an exact failure of the case, with cause ``sampler``."""
    result.sampler = sampler
    entries = [e for e in result.exact_failures if e["cause"] == "verifier"]
    if not entries:
        return
    for entry in entries:
        entry.update(cause="sampler", where=sampler, rule="accepted a draft of target probability 0")
    result.exact_failure = True
    result.failed_checks = sorted(set(result.failed_checks) | {"support"})
