"""The coverage report: which of the subject's code a run executed, per function, with the lines it never ran.

Built from coverage.py's own function regions (its JSON report has ``functions`` and ``classes`` per file from
coverage 7.5 on, so nothing here maps lines to functions) over the files of
:func:`~lossless_check.subjects.code_scope.subject_files`. Each function gives its statements and branches run,
the lines never run (split into gaps and lines out of reach on purpose, each with its reason:
:func:`~lossless_check.subjects.code_scope.out_of_reach`) and the branches never taken. Written as JSON
(:func:`coverage_json`), Markdown (:func:`coverage_markdown`) and HTML (:func:`coverage_html`, with coverage.py's
annotated sources beside it: :func:`write_coverage_reports`).
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lossless_check.subjects.code_scope import CodeFile, guarded_lines, out_of_reach

#: The report's file names, beside a gate's reports (``coverage-html/``: coverage.py's annotated sources).
COVERAGE_NAMES = ("coverage.json", "coverage.md", "coverage.html")
ANNOTATED_DIR = "coverage-html"
#: coverage.py's own data file of the run (SQLite): ``coverage report --data-file=...`` reads it, and runs combine.
DATA_NAME = "coverage.data"
#: Never-run lines named in a headline before "...".
HEADLINE_GAPS = 4


@dataclass
class FunctionCoverage:
    """One function (coverage.py region) of a measured file."""

    module: str
    function: str  # qualified name; "" is the module's own code (imports, def and class statements)
    start_line: int | None
    statements: int
    run: int
    branches: int
    branches_run: int
    never_run: list[int] = field(default_factory=list)  # gaps: lines a case could run
    out_of_reach: list[dict] = field(default_factory=list)  # {"line", "reason"}: never run, on purpose
    branches_never_taken: list[list[int]] = field(default_factory=list)  # [from, to]; to < 0: exit

    @property
    def share(self) -> float:
        """Statements run, of all."""
        return self.run / self.statements if self.statements else 1.0

    @property
    def share_reachable(self) -> float:
        """Statements run, of those not out of reach on purpose."""
        reachable = self.statements - len(self.out_of_reach)
        return self.run / reachable if reachable else 1.0

    @property
    def name(self) -> str:
        return self.function or f"{self.module} (module level)"

    def to_dict(self) -> dict:
        return {**asdict(self), "share": self.share, "share_reachable": self.share_reachable,
                "never_run_ranges": line_ranges(self.never_run)}


@dataclass
class FileCoverage:
    """A measured file: its functions (all, or those its scope selects) and their totals."""

    module: str
    path: str
    whole: bool  # every function of the file (else the selected ones: the totals are theirs)
    functions: list[FunctionCoverage]

    def total(self, key: str) -> int:
        return sum(getattr(f, key) for f in self.functions)

    @property
    def share(self) -> float:
        statements = self.total("statements")
        return self.total("run") / statements if statements else 1.0

    @property
    def share_reachable(self) -> float:
        reachable = self.total("statements") - sum(len(f.out_of_reach) for f in self.functions)
        return self.total("run") / reachable if reachable else 1.0

    def to_dict(self) -> dict:
        return {"module": self.module, "path": self.path, "scope": "whole file" if self.whole else "selected functions",
                "statements": self.total("statements"), "run": self.total("run"), "share": self.share,
                "share_reachable": self.share_reachable, "branches": self.total("branches"),
                "branches_run": self.total("branches_run"),
                "functions": [f.to_dict() for f in self.functions]}


@dataclass
class CoverageReport:
    """What a run executed of the subject's code."""

    files: list[FileCoverage]
    tool: str
    processes: int = 1  # processes whose data was merged (this one and each worker task's)
    focus: list[str] = field(default_factory=list)  # classes the headline is about (the gate's generator)

    def functions(self, prefix: str = "") -> list[FunctionCoverage]:
        """Every reported function whose qualified name is ``prefix`` or starts with ``prefix.``."""
        return [f for file in self.files for f in file.functions
                if not prefix or f.function == prefix or f.function.startswith(prefix + ".")]

    def region(self, prefix: str) -> tuple[int, int, list[FunctionCoverage]]:
        """Statements run, statements, and the functions of class or function ``prefix``."""
        functions = self.functions(prefix)
        return sum(f.run for f in functions), sum(f.statements for f in functions), functions

    def headline(self) -> str:
        """One line: how much of the focus classes (else the measured files) the run executed, and what it never ran."""
        parts = []
        for name in self.focus or []:
            run, statements, functions = self.region(name)
            if statements:
                parts.append(_said(name, run, statements, functions))
        if not parts:
            parts = [_said(f.module.rpartition(".")[2], f.total("run"), f.total("statements"), f.functions)
                     for f in self.files if f.whole]
        return "coverage: " + "; ".join(parts) if parts else "coverage: nothing measured"

    def to_dict(self) -> dict:
        return {"tool": self.tool, "processes": self.processes, "headline": self.headline(), "focus": self.focus,
                "files": [f.to_dict() for f in self.files]}


def _said(name: str, run: int, statements: int, functions: list[FunctionCoverage]) -> str:
    gaps = [f"{f.function or 'module level'} {_lines(f.never_run)}" for f in functions if f.never_run]
    text = f"exercised {run / statements:.0%} of {name} ({run}/{statements} statements)"
    if gaps:
        text += "; never ran: " + ", ".join(gaps[:HEADLINE_GAPS]) + (", ..." if len(gaps) > HEADLINE_GAPS else "")
    return text


def line_ranges(lines: list[int]) -> list[list[int]]:
    """``[3, 4, 5, 9]`` -> ``[[3, 5], [9, 9]]``."""
    ranges: list[list[int]] = []
    for line in sorted(lines):
        if ranges and line == ranges[-1][1] + 1:
            ranges[-1][1] = line
        else:
            ranges.append([line, line])
    return ranges


def _lines(lines: list[int]) -> str:
    spans = [str(a) if a == b else f"{a}-{b}" for a, b in line_ranges(lines)]
    return ("line " if len(lines) == 1 else "lines ") + ", ".join(spans)


def build_report(cov, files: list[CodeFile], processes: int = 1, focus: list[str] | None = None) -> CoverageReport:
    """The report of ``cov`` (a stopped ``coverage.Coverage`` holding the merged data) over ``files``."""
    import coverage

    data = cov.get_data()
    for f in files:  # a file no process ran reports as all never run
        if f.path not in data.measured_files():
            try:
                data.touch_file(f.path)
            except Exception:  # noqa: BLE001 - data with no measurement at all cannot take a file
                pass
    with tempfile.TemporaryDirectory(prefix="lossless-coverage-") as tmp:
        out = os.path.join(tmp, "coverage.json")
        cov.json_report(outfile=out, include=[f.path for f in files])
        doc = json.loads(Path(out).read_text())
    by_path = {os.path.realpath(os.path.abspath(k)): v for k, v in doc["files"].items()}
    reported = []
    for f in files:
        entry = by_path.get(os.path.realpath(f.path))
        if entry is None:
            continue
        text = Path(f.path).read_text(encoding="utf-8", errors="replace")
        source, guarded = text.splitlines(), guarded_lines(text)
        functions = [_function(f.module, name, region, source, guarded)
                     for name, region in entry.get("functions", {}).items() if f.selects(name)]
        reported.append(FileCoverage(f.module, f.path, f.functions is None, functions))
    return CoverageReport(reported, f"coverage.py {coverage.__version__}", processes, list(focus or []))


def _function(module: str, name: str, region: dict, source: list[str], guarded: dict[int, str]) -> FunctionCoverage:
    summary = region["summary"]
    gaps, reached = [], []
    for line in region["missing_lines"]:
        text = source[line - 1].strip() if 0 < line <= len(source) else ""
        reason = guarded.get(line) or out_of_reach(name, text)
        if reason is None:
            gaps.append(line)
        else:
            reached.append({"line": line, "reason": reason})
    return FunctionCoverage(module, name, region.get("start_line"), summary["num_statements"],
                            summary["covered_lines"], summary.get("num_branches", 0),
                            summary.get("covered_branches", 0), gaps, reached,
                            [list(b) for b in region.get("missing_branches", [])])


def focus_for(generator_class) -> list[str]:
    """The classes a gate's headline is about: the generator's own class and the built-in it subclasses."""
    if generator_class is None or not isinstance(generator_class, type):
        name = getattr(generator_class, "__qualname__", None)
        return [name] if name else []
    names = [generator_class.__qualname__]
    for base in generator_class.__mro__[1:]:
        if base.__module__ == "transformers.generation.candidate_generator" and base.__name__ != "CandidateGenerator":
            names.append(base.__qualname__)
            break
    return names


# --------------------------------------------------------------------------------------------------
# Rendering


def coverage_json(report: CoverageReport) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"


def _pct(value: float) -> str:
    return f"{value:.1%}"


def coverage_markdown(report: CoverageReport) -> str:
    """A table per file: per function, statements and branches run, the never-run lines and the lines out of reach."""
    lines = [f"### {report.headline()}", "",
             f"{report.tool}, statements and branches, merged over {report.processes} process measurement(s).", ""]
    for f in report.files:
        scope = "every function" if f.whole else "the speculative-decoding functions"
        lines += [f"#### `{f.module}` ({scope}): {f.total('run')}/{f.total('statements')} statements "
                  f"({_pct(f.share)}; {_pct(f.share_reachable)} of those in reach), {f.total('branches_run')}/"
                  f"{f.total('branches')} branches", "",
                  "| function | statements run | branches taken | never run | out of reach (reason) |",
                  "|---|---|---|---|---|"]
        for fn in f.functions:
            never = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in line_ranges(fn.never_run)) or "-"
            reach = "; ".join(f"{r['line']}: {r['reason']}" for r in fn.out_of_reach) or "-"
            lines.append(f"| `{fn.name}` | {fn.run}/{fn.statements} ({_pct(fn.share)}) | {fn.branches_run}/"
                         f"{fn.branches} | {never} | {reach.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def coverage_html(report: CoverageReport, annotated: str | None = None) -> str:
    """A self-contained page: the headline, then a table per file (``annotated``: the folder of coverage.py's
    annotated sources, linked)."""
    e = html.escape
    body = [f"<h1>{e(report.headline())}</h1>",
            f"<p>{e(report.tool)}, statements and branches, merged over {report.processes} process measurement(s)."
            + (f' Annotated sources: <a href="{e(annotated)}/index.html">{e(annotated)}/</a>.' if annotated else "")
            + "</p>"]
    for f in report.files:
        body.append(f"<h2><code>{e(f.module)}</code>: {f.total('run')}/{f.total('statements')} statements "
                    f"({_pct(f.share)}; {_pct(f.share_reachable)} in reach)</h2>")
        body.append("<table><tr><th>function</th><th>statements run</th><th>share</th><th>branches taken</th>"
                    "<th>never run</th><th>out of reach (reason)</th></tr>")
        for fn in f.functions:
            never = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in line_ranges(fn.never_run))
            reach = "<br>".join(f"{r['line']}: {e(r['reason'])}" for r in fn.out_of_reach)
            colour = "#c8e6c9" if fn.share_reachable >= 0.95 else "#fff9c4" if fn.share_reachable >= 0.5 else "#ef9a9a"
            body.append(f'<tr style="background:{colour}"><td><code>{e(fn.name)}</code></td>'
                        f"<td>{fn.run}/{fn.statements}</td><td>{_pct(fn.share)}</td>"
                        f"<td>{fn.branches_run}/{fn.branches}</td><td>{e(never)}</td><td>{reach}</td></tr>")
        body.append("</table>")
    style = ("body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #bdbdbd;padding:.2em .5em;font-size:.9em;vertical-align:top}")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>lossless-check coverage</title>'
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def save_data(cov, path: Path) -> None:
    """Write ``cov``'s merged data as a coverage.py data file at ``path`` (replacing one there)."""
    from coverage import CoverageData

    path.unlink(missing_ok=True)
    saved = CoverageData(basename=str(path))
    saved.update(cov.get_data())
    saved.write()


def write_coverage_reports(report: CoverageReport, cov, out_dir: str | Path, annotated: bool = True) -> list[Path]:
    """Write ``coverage.json``, ``coverage.md`` and ``coverage.html`` into ``out_dir``, and coverage.py's data file
    (:data:`DATA_NAME`) and, with ``annotated``, its annotated sources of the measured files (``coverage-html/``);
    return the paths of the three reports."""
    from lossless_check.running.journal import write_atomically

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_data(cov, out / DATA_NAME)
    if annotated:
        cov.html_report(directory=str(out / ANNOTATED_DIR), include=[f.path for f in report.files],
                        title="lossless-check: the subject's code a run executed")
    texts = (coverage_json(report), coverage_markdown(report),
             coverage_html(report, ANNOTATED_DIR if annotated else None))
    paths = [out / name for name in COVERAGE_NAMES]
    for path, text in zip(paths, texts, strict=True):
        write_atomically(path, text)
    return paths


__all__ = ["COVERAGE_NAMES", "DATA_NAME", "CoverageReport", "FileCoverage", "FunctionCoverage", "build_report",
           "coverage_html", "save_data",
           "coverage_json", "coverage_markdown", "focus_for", "line_ranges", "write_coverage_reports"]
