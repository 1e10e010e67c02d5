"""The coverage table of the docs: which of a release's speculative-decoding code the gate executes.

    python benchmarks/coverage_table.py --transformers 5.25.0 --matrix smoke --workers 2 --out /tmp/coverage-5.25 \
        --doc docs/reference/coverage.md [--overhead PromptLookupCandidateGenerator]

Runs ``lossless-check gate --coverage`` once per built-in generator (in the release's environment, as
``--transformers`` does), combines the gates' coverage.py data files (``coverage.data`` beside each gate's
reports), and writes the report of the union (:mod:`lossless_check.outputs.coverage_report`) as a Markdown page.
``--overhead G``: also runs G's gate with ``--no-coverage`` and ``--coverage`` side by side (each twice,
alternating) and states the ratio of their wall times, which decides whether the gate measures by default
(at most 15% more time).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _python(release: str | None) -> str:
    """The interpreter of ``release``'s environment (this one when it is the installed release)."""
    if release is None:
        return sys.executable
    from lossless_check.history.release_env import environment

    return str(environment(release, say=lambda line: print(line, file=sys.stderr)))


def _gate(python: str, generator: str, out: Path, matrix: str, workers: int, coverage: bool) -> tuple[int, float]:
    command = [python, "-m", "lossless_check", "gate", "--generator", generator, "--matrix", matrix, "--workers",
               str(workers), "--out", str(out), "--quiet", "--coverage" if coverage else "--no-coverage"]
    started = time.perf_counter()
    code = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL).returncode
    return code, time.perf_counter() - started


def combined_report(gate_dirs: list[Path], out: Path):
    """The coverage report of the union of the gates' data (run in the release's interpreter)."""
    import coverage
    from coverage import CoverageData

    from lossless_check.outputs.coverage_report import DATA_NAME, build_report
    from lossless_check.subjects.code_scope import subject_files

    path = out / "combined.data"
    path.unlink(missing_ok=True)
    combined = CoverageData(basename=str(path))
    for folder in gate_dirs:
        part = CoverageData(basename=str(folder / DATA_NAME))
        part.read()
        combined.update(part)
    combined.write()
    cov = coverage.Coverage(data_file=str(path), branch=True, config_file=False)
    cov.load()
    return build_report(cov, subject_files(), processes=len(gate_dirs))


def page(report, release: str, command: str, gates: dict, overhead: str, matrix: str) -> str:
    """The docs page: the command, the totals, the headline functions, then every function."""
    from lossless_check.outputs.coverage_report import coverage_markdown

    lines = ["# What the gate executes (coverage)", "",
             f"Measured on transformers {release} with `--coverage` (coverage.py, statements and branches, every "
             f"process) over the gate of every built-in generator, matrix `{matrix}`; this page is written by "
             f"`{command}`.", "", "| gate | exit |", "|---|---|"]
    lines += [f"| `{name}` | {code} |" for name, code in gates.items()]
    lines += ["", overhead, "", "## Totals", "",
              "| code | statements run | share | in reach | branches taken |", "|---|---|---|---|---|"]
    for f in report.files:
        lines.append(f"| `{f.module}` ({'whole file' if f.whole else 'speculative-decoding functions'}) | "
                     f"{f.total('run')}/{f.total('statements')} | {f.share:.1%} | {f.share_reachable:.1%} | "
                     f"{f.total('branches_run')}/{f.total('branches')} |")
    for name in ("_assisted_decoding", "_speculative_sampling", "_get_candidate_generator"):
        for fn in report.functions():
            if fn.function.rpartition(".")[2] == name:
                lines.append(f"| `{fn.function}` | {fn.run}/{fn.statements} | {fn.share:.1%} | "
                             f"{fn.share_reachable:.1%} | {fn.branches_run}/{fn.branches} |")
    text = coverage_markdown(report).replace("\n### ", "\n## ", 1).replace("#### ", "### ")
    return "\n".join(lines) + "\n\n## Every function\n\n" + text.split("\n", 1)[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transformers", default=None, metavar="X.Y.Z")
    parser.add_argument("--matrix", default="default")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("coverage-table"))
    parser.add_argument("--doc", type=Path, default=None, help="write the page here")
    parser.add_argument("--overhead", metavar="GENERATOR", default=None)
    parser.add_argument("--combine-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import transformers

    if args.transformers and transformers.__version__ != args.transformers:
        # Everything runs in the release's environment: the gates, and the report, which reads its own files.
        return subprocess.run([_python(args.transformers), __file__, *sys.argv[1:]], cwd=ROOT).returncode

    from lossless_check.subjects.adapters import DEFAULT_GENERATORS

    release = transformers.__version__
    gates, dirs = {}, []
    for generator in DEFAULT_GENERATORS:
        folder = args.out / generator
        if not args.combine_only:
            gates[generator], seconds = _gate(sys.executable, generator, folder, args.matrix, args.workers, True)
            print(f"{generator}: exit {gates[generator]} in {seconds:.0f} s", file=sys.stderr)
        dirs.append(folder)
    overhead = ""
    if args.overhead:
        times: dict[bool, list[float]] = {False: [], True: []}
        for coverage in (False, True, True, False):
            times[coverage].append(_gate(sys.executable, args.overhead, args.out / "overhead", args.matrix,
                                         args.workers, coverage)[1])
        ratio = sum(times[True]) / sum(times[False])
        overhead = (f"Cost of `--coverage` (gate of `{args.overhead}`, matrix {args.matrix}, {args.workers} workers, "
                    f"each way twice, alternating): {sum(times[False]) / 2:.0f} s without, "
                    f"{sum(times[True]) / 2:.0f} s "
                    f"with, ratio {ratio:.2f}.")
        print(overhead, file=sys.stderr)
    report = combined_report(dirs, args.out)
    command = (f"python benchmarks/coverage_table.py --transformers {release} --matrix {args.matrix} --workers "
               f"{args.workers}" + (f" --overhead {args.overhead}" if args.overhead else "")
               + (f" --doc {args.doc}" if args.doc else ""))
    text = page(report, release, command, gates, overhead, args.matrix)
    if args.doc:
        args.doc.write_text(text)
    print(report.headline())
    return 0


if __name__ == "__main__":
    sys.exit(main())
