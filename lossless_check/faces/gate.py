"""Pre-merge gate: one generator across a warper matrix, with reports for a pull request.

:func:`gate` runs the cases and writes, into one folder:

- ``report.json``: the JSON report (:func:`lossless_check.outputs.report.to_json`);
- ``report.md``: Markdown for a PR comment (headline, failing cases, the full table folded);
- ``report.html``: a self-contained page (figures embedded as base64 PNG) with a summary grid
  generator x warper stack coloured by verdict and, for each failing case, the expected vs
  empirical output law at position 1, the acceptance law vs theory, and the provenance table.

matplotlib draws the figures and is imported only when the HTML is written. It is a dependency;
where it cannot be imported all the same, the reports are written without figures and one line on
stderr says so (:data:`NO_PLOTS`): a gate never loses its verdict to a plotting library.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from lossless_check.core.exit_codes import FAILING
from lossless_check.evidence.results import DEFAULT_MAX_DETECTABLE_TV
from lossless_check.outputs.report import TV_COLUMNS, beside_line, blind_line, no_answer_lines, tv_cells

if TYPE_CHECKING:
    from lossless_check.evidence.results import CaseResult, RunResult

REPORT_NAMES = ("report.json", "report.md", "report.html")
#: Said (stderr, and in the HTML) where matplotlib cannot be imported and a failing case's figures are left out.
NO_PLOTS = "the HTML report's plots need matplotlib (pip install matplotlib); the reports were written without them"
#: The gate's journal of finished cases (:mod:`lossless_check.running.journal`), beside its reports.
JOURNAL_NAME = "journal.jsonl"
_MARK = {"lossless": "✅", "not_lossless": "❌", "error": "⚠️", "inconclusive": "❔", "vacuous": "⭕", "skipped": "⏭️",
         "unfinished": "⏸️"}
_COLOUR = {"lossless": "#c8e6c9", "not_lossless": "#ef9a9a", "error": "#ffe082", "inconclusive": "#ffccbc",
           "vacuous": "#d1c4e9", "skipped": "#e0e0e0", "unfinished": "#fff9c4"}


def gate(generator_spec: str, out_dir: str | Path, *, matrix_name: str = "default", modes: tuple[str, ...] | None = None,
         samples: int = 5_000, alpha: float = 1e-6, seed: int = 0, scenario: str | None = None, workers: int = 1,
         progress: Callable[[int], None] | None = None, sequential: bool = True, batch_size: int | None = None,
         return_result: bool = False, generate_samples: int = 400, repro_dir: str | Path | None = None,
         resume: bool = False, backend: str = "local", address: str | None = None, verifier: bool = True,
         verifier_gates: bool = False, max_detectable_tv: float = DEFAULT_MAX_DETECTABLE_TV, coverage: bool = False,
         torch_draws: bool = False):
    """Run ``generator_spec`` over a warper matrix, write the three reports into ``out_dir``, return the exit code.

    ``scenario=None``: the default scenario, plus the matrix's real-world cases in the first mode
    (:func:`lossless_check.faces.api.real_world_cases`). ``modes`` are :data:`lossless_check.modes.MODES`;
    by default every mode that applies: ``all``
    (the statistical step mode with the exact provenance sub-verdict beside it), ``generate`` (the
    real loop; cases generate mode cannot drive are ``skipped`` with the reason; with ``scenario=None`` the
    matrix runs on the stateful targets too, :func:`lossless_check.faces.api.stateful_cases`), ``greedy`` (exact,
    its rows from :func:`lossless_check.faces.api.greedy_cases`, whatever the matrix) and ``options`` (exact:
    the outputs, streamer and heuristic schedule of the real loop, one row, :mod:`lossless_check.modes.loop_options`). The exit code is
    :attr:`RunResult.exit_code` (1 a case not lossless or an error; 5 no answer: no case of the generator was
    checked, or one is ``inconclusive``, i.e. could not have seen a departure of TV ``max_detectable_tv``;
    0 otherwise). Bad
    input raises :class:`lossless_check.core.errors.UsageError`. ``return_result``: return
    ``(RunResult, exit code)`` instead. Generate mode (about 150 samples/s: the real loop drafts one
    sequence at a time) runs ``generate_samples`` trials per case, to catch the large effects of bugs
    in the loop; each case reports the ``tv_detectable`` that gives. ``repro_dir``: write a standalone
    reproduction script there for every failing case that has one (:func:`lossless_check.outputs.repro.write_repros`).
    Finished cases and chunks are journaled in ``out_dir`` (:data:`JOURNAL_NAME`, :mod:`lossless_check.running.journal`);
    ``resume`` runs only the others.
    An interrupted gate writes its reports with what finished and raises :class:`~lossless_check.faces.api.RunInterrupted`.
    ``verifier`` (default): the last row is the exact check of the installed ``_speculative_sampling``,
    reported beside the generator's cases; it decides the exit code too only with ``verifier_gates``.
    ``coverage``: measure which of the subject's code the gate executed, in every process
    (:mod:`lossless_check.faces.coverage_option`), write ``coverage.json``, ``coverage.md`` and ``coverage.html``
    beside the reports, and put its headline under theirs.
    ``torch_draws``: every draw by torch's own kernel (:func:`~lossless_check.faces.api.with_torch_draws`).
    """
    from lossless_check.subjects.adapters import resolve_generator
    from lossless_check.faces.api import (
        DEFAULT_SCENARIO, RunInterrupted, greedy_cases, real_world_cases, resolve_scenario, run_cases, stateful_cases,
        with_torch_draws,
    )
    from lossless_check.running.journal import Journal, run_identity
    from lossless_check.laws.matrix import matrix
    from lossless_check.evidence.results import Case
    from lossless_check.faces.coverage_option import measured

    with measured([generator_spec], coverage) as measurement:
        generator = resolve_generator(generator_spec)
        if modes is None:
            modes = ("all", "generate", "greedy", "options")
        cases = [Case(generator, stack, mode, resolve_scenario(scenario or DEFAULT_SCENARIO, mode)) for mode in modes
                 if mode not in ("greedy", "options") for stack in matrix(matrix_name)]
        if scenario is None:
            cases += real_world_cases([generator], matrix_name, modes[0])
            if "generate" in modes:
                cases += stateful_cases([generator], matrix(matrix_name))
        if "greedy" in modes:
            cases += greedy_cases([generator], [], scenario)
        if "options" in modes:
            from lossless_check.modes.loop_options import options_cases

            cases += options_cases([generator], resolve_scenario(scenario or DEFAULT_SCENARIO, "options"))
        if scenario is None:  # an encoder-decoder target, for the family generate() routes it to
            from lossless_check.modes.loop_options import OPTIONS_STACK
            from lossless_check.modes.seq2seq import seq2seq_cases

            cases += seq2seq_cases([generator], modes, OPTIONS_STACK)
        cases = with_torch_draws(cases, torch_draws)
        if hasattr(progress, "set_total"):
            progress.set_total(len(cases))
        by_mode = {"generate": min(samples, generate_samples)}
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        identity = {**run_identity(cases, samples, alpha, seed, sequential, batch_size), "samples_by_mode": by_mode}
        journal = Journal(Path(out_dir) / JOURNAL_NAME, identity, resume)
        if resume:
            import sys

            print(f"lossless-check: resuming: {journal.kept()}", file=sys.stderr)
        try:
            result = run_cases(cases, samples, alpha, seed, workers, progress, sequential=sequential,
                               batch_size=batch_size, samples_by_mode=by_mode, journal=journal, backend=backend,
                               address=address, verifier=verifier, verifier_gates=verifier_gates,
                               max_detectable_tv=max_detectable_tv)
        except RunInterrupted as stopped:
            write_reports(stopped.partial, out_dir, title=generator_spec)
            raise
    covered = None
    if measurement is not None:
        from lossless_check.outputs.coverage_report import focus_for

        covered = measurement.report(focus_for(generator.generator_class))
        measurement.write(covered, out_dir)
    write_reports(result, out_dir, title=generator_spec, coverage=covered)
    if repro_dir is not None:
        from lossless_check.outputs.repro import write_repros

        print("\n".join(write_repros(cases, result.cases, repro_dir)))
    return (result, result.exit_code) if return_result else result.exit_code


def write_reports(result: RunResult, out_dir: str | Path, title: str, coverage=None) -> list[Path]:
    """Write ``report.json``, ``report.md`` and ``report.html`` into ``out_dir``; return their paths.
    ``coverage`` (a :class:`~lossless_check.outputs.coverage_report.CoverageReport`): its headline goes under
    theirs, and the JSON says where the coverage report is."""
    from lossless_check.outputs.report import to_json

    import sys

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = to_json(result)
    notes = []
    if coverage is not None:
        from lossless_check.outputs.coverage_report import COVERAGE_NAMES

        notes = [coverage.headline() + f" (per function: {COVERAGE_NAMES[1]}, {COVERAGE_NAMES[2]})"]
        doc["coverage"] = {"headline": coverage.headline(), "report": COVERAGE_NAMES[0],
                           "files": [{k: v for k, v in f.to_dict().items() if k != "functions"}
                                     for f in coverage.files]}
    plots = _can_plot()
    texts = (json.dumps(doc, indent=2) + "\n", to_markdown(result, doc, title, notes),
             to_html(result, doc, title, plots, notes))
    paths = [out / name for name in REPORT_NAMES]
    from lossless_check.running.journal import write_atomically

    for path, text in zip(paths, texts):
        write_atomically(path, text)
    if not plots and any(c.verdict in FAILING for c in result.subjects):
        print(f"lossless-check: {NO_PLOTS}", file=sys.stderr)
    return paths


def _can_plot() -> bool:
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        return False
    return True


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _headline(result: RunResult) -> str:
    """The verdict on the subjects (rows reported beside them follow in their own line: :func:`beside_line`;
    what was not checked, and why, in :func:`~lossless_check.outputs.report.no_answer_lines`)."""
    subjects = result.subjects
    failing = sum(c.verdict in FAILING for c in subjects)
    counts = result.counts()
    # Cases that fail nothing but tested nothing (or too little) about q: said beside the verdict, never passes.
    untested = [f"{counts[v]} {v}" for v in ("inconclusive", "vacuous", "skipped") if counts[v]]
    untested = f" ({', '.join(untested)}: not passes)" if untested else ""
    if failing:
        return f"not lossless: {failing} of {len(subjects)} cases fail{untested}"
    if result.exit_code:
        return (f"no answer: {counts['lossless']} of {len(subjects)} cases checked and lossless{untested}; "
                f"see what was not checked below")
    return f"lossless: all {counts['lossless']} checked cases pass{untested}"


def _notes(result: RunResult) -> list[str]:
    """Lines under the headline: a blind exact pass (:func:`blind_line`), and the rows reported beside
    the subjects (:func:`beside_line`)."""
    return [line for line in no_answer_lines(result) + [blind_line(result)] + [beside_line(c) for c in result.beside]
            if line]


def _context(result: RunResult, doc: dict) -> str:
    return (f"transformers {doc['transformers_version']} · torch {doc['torch_version']} · family alpha "
            f"{result.alpha_family:g} · seed {result.seed} · {result.samples} samples per case")


_COLUMNS = ("generator", "warpers", "mode", "verdict", "n", *TV_COLUMNS, "p (Holm)", "accept", "theory")


def _in(c: CaseResult, main_scenario: str) -> str:
    """``mode``, with the scenario when it is not the run's main one (the real-world cases)."""
    return c.mode if c.scenario == main_scenario else f"{c.mode}, {c.scenario}"


def _main_scenario(result: RunResult) -> str:
    return result.cases[0].scenario if result.cases else ""


def _row(c: CaseResult, main_scenario: str) -> list[str]:
    return [c.generator, c.warpers, _in(c, main_scenario), c.verdict, str(c.samples or "-"), *tv_cells(c),
            _fmt(c.p_value_adjusted, ".2g"), _fmt(c.acceptance_rate, ".3f"),
            _fmt(c.expected_acceptance_rate, ".3f")]


def to_markdown(result: RunResult, doc: dict, title: str, extra: list[str] = ()) -> str:
    """Markdown for a PR comment: a headline, one line per failing case, the full table in a fold (``extra``:
    lines under the headline's notes, e.g. the coverage headline)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    mark = {0: "✅", 1: "❌"}.get(result.exit_code, "❔")
    main = _main_scenario(result)
    lines = [f"### {mark} lossless-check gate: `{title}` — {_headline(result)}", "", _context(result, doc), ""]
    notes = _notes(result) + list(extra)
    lines += [f"- {cell(note)}" for note in notes] + ([""] if notes else [])
    for c in result.subjects:
        if c.verdict in FAILING + ("inconclusive",):
            where = [check.split("@")[1] for check in c.failed_checks if check.startswith("output_law@")]
            facts = [f"failing position{'s' if len(where) > 1 else ''} {', '.join(where)}" if where else "",
                     f"provenance: {c.provenance['verdict']}" if c.provenance else ""]
            facts = "; ".join(f for f in facts if f)
            lines.append(f"- {_MARK[c.verdict]} **{c.generator}** `{c.warpers}` ({_in(c, main)}): {cell(c.reason)}"
                         + (f" ({cell(facts)})" if facts else ""))
    lines += ["", "<details><summary>All cases</summary>", "",
              "| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for c in result.subjects:
        values = _row(c, main)
        values[3] = f"{_MARK.get(c.verdict, '')} {c.verdict}"
        lines.append("| " + " | ".join(cell(v) for v in values) + " |")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _bars(title: str, xlabel: str, expected: list[float], empirical: list[float]) -> str:
    """Grouped bars, expected beside empirical, as a base64 PNG."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.0))
    ax = fig.subplots()
    x = range(len(expected))
    ax.bar([i - 0.2 for i in x], expected, 0.4, label="expected", color="#90a4ae")
    ax.bar([i + 0.2 for i in x], empirical, 0.4, label="empirical", color="#e53935")
    ax.set_xticks(list(x))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("probability")
    ax.set_title(title)
    ax.legend()
    return _png(fig)


def _figure(png: str, alt: str, caption: str) -> str:
    return (f'<figure><img src="data:image/png;base64,{png}" alt="{html.escape(alt)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _provenance_table(provenance: dict) -> str:
    e = html.escape
    head = f"<p>provenance: <b>{e(str(provenance.get('verdict')))}</b> — {e(str(provenance.get('reason', '')))}</p>"
    positions = provenance.get("positions") or []
    if not positions:
        return head
    columns = ("position", "rule", "max_abs_diff", "tv", "foreign_mass", "inflation", "consistent")

    def cell(value) -> str:
        return e(format(value, ".4g") if isinstance(value, float) else str(value))

    rows = "".join("<tr>" + "".join(f"<td>{cell(p.get(k))}</td>" for k in columns) + "</tr>" for p in positions)
    return (f'{head}<table class="cases provenance"><tr>{"".join(f"<th>{c}</th>" for c in columns)}</tr>'
            f"{rows}</table>")


def _failing_section(index: int, c: CaseResult, main_scenario: str, plots: bool = True) -> str:
    e = html.escape
    name = f"{c.generator} [{c.warpers}] ({_in(c, main_scenario)})"
    parts = [f'<section id="case-{index}"><h3>{e(name)}: {e(c.verdict)}</h3>',
             f"<p>{e(c.reason)}</p>"]
    if c.failed_checks:
        parts.append(f"<p>failed sub-checks: <code>{e(', '.join(c.failed_checks))}</code></p>")
    if c.diagnostics:
        parts.append(f"<p>diagnostics (assume the drafter samples the processed drafter table): "
                     f"<code>{e(', '.join(c.diagnostics))}</code></p>")
    if not plots:
        parts.append(f"<p>{e(NO_PLOTS)}</p>")
    if plots and c.expected_law is not None and c.empirical_law is not None:
        j = c.law_position or 1  # the first failing position (position 1 when none failed on its own)
        at = next((p for p in c.positions if p["position"] == j), {})
        png = _bars(f"output law at position {j} (TV {_fmt(at.get('tv', c.tv), '.4f')}, "
                    f"n={at.get('samples', c.samples)})", "token", c.expected_law, c.empirical_law)
        parts.append(_figure(png, f"position-{j} distribution of {name}",
                             f"Output law at position {j}: expected (target after warpers) vs empirical."))
    if plots and c.acceptance_law is not None and c.expected_acceptance_law is not None:
        png = _bars(f"acceptance law (rate {_fmt(c.acceptance_rate, '.3f')} vs theory "
                    f"{_fmt(c.expected_acceptance_rate, '.3f')})", "accepted drafts (n_matches)",
                    c.expected_acceptance_law, c.acceptance_law)
        parts.append(_figure(png, f"acceptance law of {name}", "Accepted drafts per round: theory vs empirical."))
    if c.provenance:
        parts.append(_provenance_table(c.provenance))
    parts.append("</section>")
    return "".join(parts)


def _grid(result: RunResult, anchors: dict[int, int]) -> str:
    e = html.escape
    main = _main_scenario(result)
    subjects = [(i, c) for i, c in enumerate(result.cases) if c.subject]
    rows = list(dict.fromkeys(f"{c.generator} ({_in(c, main)})" for _, c in subjects))
    stacks = list(dict.fromkeys(c.warpers for _, c in subjects))
    cells = {(f"{c.generator} ({_in(c, main)})", c.warpers): (i, c) for i, c in subjects}
    out = ['<table class="grid"><tr><th>generator (mode) \\ warpers</th>']
    out += [f"<th><code>{e(s)}</code></th>" for s in stacks] + ["</tr>"]
    for row in rows:
        out.append(f"<tr><th>{e(row)}</th>")
        for stack in stacks:
            if (row, stack) not in cells:
                out.append("<td></td>")
                continue
            i, c = cells[(row, stack)]
            label = e(c.verdict)
            if i in anchors:
                label = f'<a href="#case-{anchors[i]}">{label}</a>'
            out.append(f'<td class="v-{e(c.verdict)}" title="{e(c.reason)}">{label}</td>')
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #212121; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #bdbdbd; padding: 0.25em 0.5em; font-size: 0.9em; }
table.cases td { text-align: right; }
table.grid td { text-align: center; }
figure { display: inline-block; margin: 0.5em 1em 0.5em 0; }
figcaption { font-size: 0.85em; color: #616161; }
section { border-top: 1px solid #e0e0e0; padding-top: 0.5em; }
""" + "".join(f".v-{verdict} {{ background: {colour}; }}\n" for verdict, colour in _COLOUR.items())


def to_html(result: RunResult, doc: dict, title: str, plots: bool = True, extra: list[str] = ()) -> str:
    """A self-contained HTML report: summary grid, a section with figures per failing case (``plots``:
    drawn with matplotlib; else said), the full table."""
    e = html.escape
    failing = [(i, c) for i, c in enumerate(result.cases) if c.subject and c.verdict in FAILING]
    anchors = {i: n for n, (i, _) in enumerate(failing)}
    body = [f"<h1>lossless-check gate: <code>{e(title)}</code></h1>",
            f"<p><b>{e(_headline(result))}</b></p><p>{e(_context(result, doc))}</p>",
            *(f"<p>{e(note)}</p>" for note in _notes(result) + list(extra)), "<h2>Summary</h2>", _grid(result, anchors)]
    if failing:
        body.append("<h2>Failing cases</h2>")
        body += [_failing_section(anchors[i], c, _main_scenario(result), plots) for i, c in failing]
    body.append('<h2>All cases</h2><table class="cases"><tr>' + "".join(f"<th>{c}</th>" for c in _COLUMNS) + "</tr>")
    for c in result.subjects:
        body.append(f'<tr class="v-{e(c.verdict)}">' + "".join(f"<td>{e(v)}</td>" for v in _row(c, _main_scenario(result))) + "</tr>")
    body.append("</table>")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>lossless-check gate: {e(title)}'
            f"</title><style>{_STYLE}</style></head><body>{''.join(body)}</body></html>\n")
