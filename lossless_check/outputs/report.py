"""Reports: the JSON document of DESIGN.md section 5 and the terminal table."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lossless_check.core.compat import versions
from lossless_check.core.exit_codes import FAILING
from lossless_check.evidence.results import BLIND, RunResult


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


#: Report fields that measure time: two runs of the same work (resumed, split, on other workers) differ there only.
TIMING_FIELDS = ("seconds", "samples_per_second")


def without_timings(value):
    """``value`` (a report or any part of one) without its :data:`TIMING_FIELDS`, at any depth (a
    provenance sub-verdict has its own): what a resumed or split run must equal."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_FIELDS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def to_json(result: RunResult) -> dict:
    """The run as the JSON report's document (keys and meanings fixed by DESIGN.md)."""
    doc = {
        **versions(),
        "alpha_family": result.alpha_family,
        "seed": result.seed,
        "samples": result.samples,
        "power": 0.99,
        "interrupted": result.interrupted,
        "workers_lost": result.workers_lost,
        "sampler": sampler_in_place_of_verifier(result),
        "cases": [c.to_dict() for c in result.cases],
    }
    return _clean(doc)


def sampler_in_place_of_verifier(result: RunResult) -> str | None:
    """The user's sampler (``module:function``) the run's cases ran in place of ``_speculative_sampling``."""
    return next((c.sampler for c in result.cases if c.sampler), None)


def write_json(result: RunResult, path: str | Path) -> None:
    """The JSON report at ``path``, replaced atomically (a reader never sees half of one)."""
    from lossless_check.running.journal import write_atomically

    write_atomically(path, json.dumps(to_json(result), indent=2, sort_keys=False) + "\n")


VERDICT_STYLE = {"lossless": "green", "not_lossless": "bold red", "inconclusive": "dark_orange", "vacuous": "magenta",
                 "error": "yellow", "skipped": "dim", "unfinished": "yellow"}
#: ``--table auto`` prints the per-case table up to this many cases (a matrix run gets the summary).
AUTO_TABLE_CASES = 40


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


#: The table's TV columns: :func:`tv_cells`.
TV_COLUMNS = ("max TV @pos", "detectable TV there")


def tv_cells(c) -> tuple[str, str]:
    """The table's TV cells: the case's largest per-position TV with its position, and the detectable TV
    at that same position (a failure at positions 2-3 is not shown as position 1's TV beside position
    1's power). Cases without per-position tests (verifier, generate mode's own) show their headline."""
    measured = [p for p in c.positions if isinstance(p.get("tv"), float) and math.isfinite(p["tv"])]
    if not measured:
        return _fmt(c.tv, ".4f"), _fmt(c.tv_detectable, ".4f")
    worst = max(measured, key=lambda p: p["tv"])
    # A vacuous case states no power (decide() cleared it): nothing there to detect.
    detectable = None if c.tv_detectable is None else worst.get("tv_detectable")
    return f"{worst['tv']:.4f} @{worst['position']}", _fmt(detectable, ".4f")


def _note(c) -> str:
    """The table's last column: why a case was skipped or vacuous, or how its trials were batched when not
    batched, and whether its exact provenance pass was blind."""
    if c.verdict in ("skipped", "vacuous"):
        return c.reason
    notes = [c.batch.get("note", "")] if c.batch and c.batch.get("batch_size", 1) <= 1 else []
    if c.exact_pass_blind:
        notes.append(BLIND)
    return "; ".join(notes)


def blind_line(result: RunResult) -> str | None:
    """A line for the summary when the exact provenance pass was blind on some subjects (passing ones too)."""
    blind = [c for c in result.subjects if c.exact_pass_blind]
    if not blind:
        return None
    ran = sum(bool(c.provenance) for c in result.subjects)
    return f"{len(blind)} of {ran} cases with an exact pass: {BLIND}"


def no_answer_lines(result: RunResult) -> list[str]:
    """Lines saying why a run gives no answer (exit 5): each subject none of whose cases was checked, with
    why, and the count of ``inconclusive`` cases (each is listed with its reason)."""
    lines = [f"not checked: {name}: {why}" for name, why in result.unchecked().items()]
    inconclusive = sum(c.verdict == "inconclusive" for c in result.subjects)
    if inconclusive:
        lines.append(f"{inconclusive} inconclusive case{'s' if inconclusive > 1 else ''}: nothing rejected, but "
                     f"too little power to call it a pass (each says what it could detect and what would)")
    return lines


def console_for(rows: list[list[str]] | None = None):
    """A rich console that never cuts a name: in a terminal, its own width (tables fold long cells);
    elsewhere (a CI log), wide enough for a table of ``rows`` (headers included) with every row on one line."""
    import sys

    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    columns = list(zip(*rows)) if rows else []
    widest = sum(max(len(cell) for cell in column) + 3 for column in columns) + 1  # cells, padding, borders
    return Console(width=max(200, widest), soft_wrap=True)


def print_table(result: RunResult, console=None, table: str = "auto") -> None:
    """What a run prints: the per-case table (``table``: ``full``, ``summary``, or ``auto``: full up
    to :data:`AUTO_TABLE_CASES` cases), then a summary line per generator, then every failing case
    in full. No generator name or warper stack is ever cut."""
    from rich.table import Table

    subjects = result.subjects
    scenarios = len({c.scenario for c in subjects}) > 1  # a scenario column when a run spans several
    numeric = ("n", *TV_COLUMNS, "p (Holm)", "accept", "theory")
    columns = ("generator", "warpers") + (("scenario",) if scenarios else ()) + ("mode", "verdict") + numeric + ("note",)
    rows = [list(columns)] + [[c.generator, c.warpers, *((c.scenario,) if scenarios else ()), c.mode, c.verdict, str(c.samples or "-"),
             *tv_cells(c), _fmt(c.p_value_adjusted, ".2g"),
             _fmt(c.acceptance_rate, ".3f"), _fmt(c.expected_acceptance_rate, ".3f"), _note(c)] for c in subjects]
    console = console or console_for(rows)
    info = versions()
    title = (f"lossless-check  transformers {info['transformers_version']}  torch {info['torch_version']}  "
             f"family alpha {result.alpha_family:g}  seed {result.seed}")
    if sampler_in_place_of_verifier(result):
        title += f"  sampler {sampler_in_place_of_verifier(result)} in place of _speculative_sampling"
    if table == "full" or (table == "auto" and len(subjects) <= AUTO_TABLE_CASES):
        grid = Table(title=title, title_justify="left")
        longest = max((len(c.generator) for c in subjects), default=9)
        for column in columns:
            grid.add_column(column, justify="right" if column in numeric else "left", overflow="fold",
                            min_width=longest if column == "generator" else None)
        for c, row in zip(subjects, rows[1:]):
            style = VERDICT_STYLE.get(c.verdict, "")
            grid.add_row(*row[: 3 + scenarios], f"[{style}]{c.verdict}[/]", *row[4 + scenarios :])
        console.print(grid)
    else:
        console.print(title, highlight=False)
    print_summary(result, console, scenarios)


def beside_line(c) -> str:
    """One line for a row reported beside the subjects (:attr:`RunResult.beside`: the installed verifier
    in a run of named generators): its state, and that it does not decide the exit code."""
    return (f"installed verifier {c.generator}: {c.verdict} (not a subject here: reported, not deciding the exit "
            f"code): {c.reason}")


def print_summary(result: RunResult, console, scenarios: bool) -> None:
    """One line per generator (its verdict counts, its first failing stack in full), the failing cases
    in full, a line per row reported beside them (:func:`beside_line`), and the subjects' counts."""
    by_generator: dict[str, list] = {}
    for c in result.subjects:
        by_generator.setdefault(c.generator, []).append(c)
    for generator, cases in by_generator.items():
        counts = ", ".join(f"{n} {v}" for v in VERDICT_STYLE if (n := sum(c.verdict == v for c in cases)))
        failing = next((c for c in cases if c.verdict in FAILING), None)
        first = f"; first failing: [{failing.warpers}] {failing.mode}" if failing else ""
        console.print(f"{generator}: {counts}{first}", highlight=False, markup=False, emoji=False)
    for c in result.subjects:
        if c.verdict in FAILING + ("inconclusive",):
            where = f" {c.scenario}" if scenarios else ""
            console.print(f"[{VERDICT_STYLE[c.verdict]}]{c.verdict}[/] ", end="", highlight=False)
            console.print(f"{c.generator} [{c.warpers}]{where} {c.mode}: {c.reason}", highlight=False, markup=False,
                          emoji=False)
    for line in no_answer_lines(result) + [blind_line(result)] + [beside_line(c) for c in result.beside]:
        if line:
            console.print(line, highlight=False, markup=False)
    counts = result.counts()
    console.print(", ".join(f"{n} {v}" for v, n in counts.items() if n), highlight=False)
