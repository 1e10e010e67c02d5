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
import json
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


def _gate(python: str, generator: str, out: Path, matrix: str, workers: int, coverage: bool,
          trials: tuple[str, ...] = ()) -> tuple[int, float]:
    command = [python, "-m", "lossless_check", "gate", "--generator", generator, "--matrix", matrix, "--workers",
               str(workers), "--out", str(out), "--quiet", "--coverage" if coverage else "--no-coverage", *trials]
    started = time.perf_counter()
    code = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL).returncode
    return code, time.perf_counter() - started


def _loaded(data_file: Path):
    import coverage

    cov = coverage.Coverage(data_file=str(data_file), branch=True, config_file=False)
    cov.load()
    return cov


def external_gate(python: str, generator: str, out: Path, matrix: str, trials: tuple[str, ...] = ()) -> Path:
    """``generator``'s gate run under coverage.py's own ``coverage run`` (one process: ``--workers 1``), measuring
    the same files, without the gate's ``--coverage``; the path of its data file."""
    from lossless_check.subjects.code_scope import subject_files

    data = out / "external.data"
    data.unlink(missing_ok=True)
    include = ",".join(f.path for f in subject_files())
    subprocess.run([python, "-m", "coverage", "run", f"--data-file={data}", "--branch", f"--include={include}", "-m",
                    "lossless_check", "gate", "--generator", generator, "--matrix", matrix, "--workers", "1",
                    "--out", str(out / "external-gate"), "--quiet", "--no-coverage", *trials], cwd=ROOT,
                   stdout=subprocess.DEVNULL, check=False)
    return data


def agreement(external: Path, ours: Path) -> str:
    """Whether the gate's own report (its ``coverage.data``) and coverage.py's ``coverage run`` of the same gate
    give every measured function the same lines run and branches taken; one sentence."""
    from lossless_check.outputs.coverage_report import build_report
    from lossless_check.subjects.code_scope import subject_files

    def per_function(data_file: Path) -> dict:
        report = build_report(_loaded(data_file), subject_files())
        return {f.function: (f.run, tuple(f.never_run), f.branches_run) for f in report.functions()}

    theirs, mine = per_function(external), per_function(ours)
    differ = sorted(name for name in theirs if theirs[name] != mine.get(name))
    if not differ:
        return f"identical in all {len(theirs)} measured functions (lines run, lines never run, branches taken)"
    return f"different in {len(differ)} of {len(theirs)} functions: {', '.join(differ)}"


def combined_report(gate_dirs: list[Path], out: Path):
    """The coverage report of the union of the gates' data (run in the release's interpreter)."""
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
    return build_report(_loaded(path), subject_files(), processes=len(gate_dirs))


def page(report, release: str, command: str, gates: dict, overhead: str, matrix: str,
         trials: tuple[str, ...] = ()) -> str:
    """The docs page: the command, the totals, the headline functions, then every function."""
    from lossless_check.outputs.coverage_report import coverage_markdown

    lines = ["# What the gate executes (coverage)", "",
             f"Measured on transformers {release} with `--coverage` (coverage.py, statements and branches, every "
             f"process) over the gate of every built-in generator, matrix `{matrix}`; this page is written by "
             f"`{command}`.", ""]
    if trials:
        lines += [f"Every case of those gates ran with `{' '.join(trials)}`: the first trials of the default gate's "
                  f"(a case's chunks are seeded by their index, and stop where the default's do), so the figures "
                  f"are a lower bound on what the default gate executes. The exit codes are those of the smaller "
                  f"gates.", ""]
    lines += ["| gate | exit |", "|---|---|"]
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
    parser.add_argument("--samples", type=int, default=None,
                        help="trials per case (the gate's default when left out). A case's chunks are seeded by "
                             "their index, so fewer trials run the first of the default's: a lower bound")
    parser.add_argument("--generate-samples", type=int, default=None, help="trials per generate-mode case")
    parser.add_argument("--agreement", metavar="GENERATOR", default=None,
                        help="also run GENERATOR's gate under coverage.py's own `coverage run` and compare its data "
                             "with the gate's own report")
    parser.add_argument("--combine-only", action="store_true",
                        help="run no gate: combine those already in --out (their exit codes kept in exits.json)")
    args = parser.parse_args()
    import transformers

    if args.transformers and transformers.__version__ != args.transformers:
        # Everything runs in the release's environment: the gates, and the report, which reads its own files.
        return subprocess.run([_python(args.transformers), __file__, *sys.argv[1:]], cwd=ROOT).returncode

    from lossless_check.subjects.adapters import DEFAULT_GENERATORS

    trials = tuple(str(a) for flag, n in (("--samples", args.samples), ("--generate-samples", args.generate_samples))
                   if n is not None for a in (flag, n))
    release = transformers.__version__
    exits = args.out / "exits.json"
    gates = json.loads(exits.read_text()) if args.combine_only and exits.is_file() else {}
    dirs = [args.out / generator for generator in DEFAULT_GENERATORS]
    for generator, folder in zip(DEFAULT_GENERATORS, dirs, strict=True):
        if not args.combine_only:
            gates[generator], seconds = _gate(sys.executable, generator, folder, args.matrix, args.workers, True,
                                              trials)
            print(f"{generator}: exit {gates[generator]} in {seconds:.0f} s", file=sys.stderr)
            exits.write_text(json.dumps(gates))
    overhead = ""
    if args.overhead:
        times: dict[bool, list[float]] = {False: [], True: []}
        for coverage in (False, True, True, False):
            times[coverage].append(_gate(sys.executable, args.overhead, args.out / "overhead", args.matrix,
                                         args.workers, coverage, trials)[1])
        ratio = sum(times[True]) / sum(times[False])
        overhead = (f"Cost of `--coverage` (gate of `{args.overhead}`, matrix {args.matrix}, {args.workers} workers, "
                    f"each way twice, alternating): {sum(times[False]) / 2:.0f} s without, "
                    f"{sum(times[True]) / 2:.0f} s "
                    f"with, ratio {ratio:.2f}.")
        print(overhead, file=sys.stderr)
    report = combined_report(dirs, args.out)
    if not any(f.total("run") for f in report.files):  # data of other paths: a page of 0% would be a false figure
        sys.exit(f"coverage_table: the gates' data in {args.out} ran none of the files in scope here "
                 f"({', '.join(f.module for f in report.files)}): made by another checkout's release environment? "
                 f"Run the gates again from this checkout (without --combine-only).")
    if args.agreement:
        said = agreement(external_gate(sys.executable, args.agreement, args.out, args.matrix, trials),
                         args.out / args.agreement / "coverage.data")
        overhead += (f"\n\nAgreement with coverage.py's own `coverage run` of the gate of `{args.agreement}` (one "
                     f"process) and the gate's report ({args.workers} workers): {said}.")
        print(said, file=sys.stderr)
    command = (f"python benchmarks/coverage_table.py --transformers {release} --matrix {args.matrix} --workers "
               f"{args.workers}" + "".join(f" {a}" for a in trials) + (f" --overhead {args.overhead}" if args.overhead else "")
               + (f" --agreement {args.agreement}" if args.agreement else "")
               + (f" --doc {args.doc}" if args.doc else ""))
    text = page(report, release, command, gates, overhead, args.matrix, trials)
    if args.doc:
        args.doc.write_text(text)
    print(report.headline())
    return 0


if __name__ == "__main__":
    sys.exit(main())
