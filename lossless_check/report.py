"""Reports: the JSON document of DESIGN.md section 5 and the terminal table."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .compat import versions
from .results import RunResult


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_json(result: RunResult) -> dict:
    """The run as the JSON report's document (keys and meanings fixed by DESIGN.md)."""
    doc = {
        **versions(),
        "alpha_family": result.alpha_family,
        "seed": result.seed,
        "samples": result.samples,
        "power": 0.99,
        "cases": [c.to_dict() for c in result.cases],
    }
    return _clean(doc)


def write_json(result: RunResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_json(result), indent=2, sort_keys=False) + "\n")


VERDICT_STYLE = {"lossless": "green", "not_lossless": "bold red", "error": "yellow", "vacuous": "magenta",
                 "skipped": "dim"}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _note(c) -> str:
    """The table's last column: why a case was skipped or vacuous, or how its trials were batched when not batched."""
    if c.verdict in ("skipped", "vacuous"):
        return c.reason
    if c.batch and c.batch.get("batch_size", 1) <= 1:
        return c.batch.get("note", "")
    return ""


def print_table(result: RunResult, console=None) -> None:
    """A table a person reads at a glance (skip reasons in its last column), then one line per failing case."""
    import sys

    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=None if sys.stdout.isatty() else 200)
    info = versions()
    table = Table(
        title=(f"lossless-check  transformers {info['transformers_version']}  torch {info['torch_version']}  "
               f"family alpha {result.alpha_family:g}  seed {result.seed}"),
        title_justify="left",
    )
    numeric = ("n", "TV", "detectable TV", "p (Holm)", "accept", "theory")
    # The scenario column only when a run spans several (the matrices' real-world cases).
    scenarios = len({c.scenario for c in result.cases}) > 1
    for column in ("generator", "warpers") + (("scenario",) if scenarios else ()) + ("mode", "verdict") + numeric + ("note",):
        table.add_column(column, justify="right" if column in numeric else "left",
                         overflow="fold" if column == "note" else "ellipsis")
    for c in result.cases:
        style = VERDICT_STYLE.get(c.verdict, "")
        table.add_row(
            c.generator, c.warpers, *((c.scenario,) if scenarios else ()), c.mode, f"[{style}]{c.verdict}[/]",
            str(c.samples or "-"),
            _fmt(c.tv, ".4f"), _fmt(c.tv_detectable, ".4f"), _fmt(c.p_value_adjusted, ".2g"),
            _fmt(c.acceptance_rate, ".3f"), _fmt(c.expected_acceptance_rate, ".3f"), _note(c),
        )
    console.print(table)
    for c in result.cases:
        if c.verdict in ("not_lossless", "error"):
            where = f" {c.scenario}" if scenarios else ""
            console.print(f"[{VERDICT_STYLE[c.verdict]}]{c.verdict}[/] {c.generator} [{c.warpers}]{where} {c.mode}: {c.reason}",
                          highlight=False)
    counts = result.counts()
    console.print(", ".join(f"{n} {v}" for v, n in counts.items() if n), highlight=False)
