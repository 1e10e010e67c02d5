"""Compatibility job: the harness on several transformers 5.x releases, one virtual env each.

    python benchmarks/compat.py [--releases 5.0.0 5.23.0 ...] [--root DIR] [--samples N]
                                [--matrix smoke] [--scenario markov8] [--seed S]

For each release: a venv at ``ROOT/venv-<release>`` (made once, then reused) that sees this
machine's torch, numpy, scipy and rich (``--system-site-packages``: the torch wheel is large and
the same for every release) and installs its own ``transformers==<release>`` with whatever
``tokenizers``/``huggingface-hub`` that release requires. It then runs
``python -m lossless_check run --matrix M --json ROOT/<release>.json`` with this checkout first on
``PYTHONPATH`` (so the code under test is this tree, not an installed copy).

Prints a generator x release table of verdicts (over the matrix's warper stacks), then every
verdict that is not ``lossless`` with its reason. Exit code 0 if every release ran, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import venv
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The oldest 5.x, the first with SinglePositionMultiToken, the first with MTP, the last and the
#: first releases around the ``_speculative_sampling(is_done_candidate=...)`` change, and the two
#: newest that install here (5.25.0 needs ``kernels>=0.19.1``, which this package index lacks).
DEFAULT_RELEASES = ("5.0.0", "5.10.4", "5.14.1", "5.17.0", "5.18.0", "5.23.0", "5.24.0")
#: Worst first: the order in which a cell lists its verdicts.
SEVERITY = ("not_lossless", "error", "lossless", "skipped", "absent")


def ensure_venv(root: Path, release: str) -> Path:
    """The venv's python, with ``transformers==release`` installed."""
    env_dir = root / f"venv-{release}"
    python = env_dir / "bin" / "python"
    if not python.exists():
        venv.create(env_dir, system_site_packages=True, with_pip=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    f"transformers=={release}"], check=True)
    return python


def run_release(python: Path, report: Path, args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    command = [str(python), "-m", "lossless_check", "run", "--matrix", args.matrix, "--scenario", args.scenario,
               "--samples", str(args.samples), "--seed", str(args.seed), "--json", str(report), "--quiet"]
    # Exit 1 (a case not lossless) is a result, not a failure of the job.
    return subprocess.run(command, env=env, cwd=report.parent, capture_output=True, text=True)


def verdict(case: dict) -> str:
    """A case's verdict; a generator the release does not have is ``absent``."""
    if case["verdict"] == "skipped" and "not in the installed transformers" in case.get("reason", ""):
        return "absent"
    return case["verdict"]


def cell(cases: list[dict]) -> str:
    """``lossless``, or each verdict with its share of the warper stacks (``not_lossless 1/2, lossless 1/2``)."""
    if not cases:
        return "-"
    counts = Counter(verdict(c) for c in cases)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{v} {counts[v]}/{len(cases)}" for v in SEVERITY if v in counts)


def print_table(reports: dict[str, dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    generators = list(dict.fromkeys(c["generator"] for r in reports.values() for c in r["cases"]))
    table = Table(title=f"verdicts by generator and transformers release (torch {_torch_versions(reports)})")
    table.add_column("generator")
    for release in reports:
        table.add_column(release)
    for generator in generators:
        table.add_row(generator, *(cell([c for c in r["cases"] if c["generator"] == generator])
                                   for r in reports.values()))
    console = Console(width=max(160, 28 + 22 * len(reports)))
    console.print(table)
    for release, report in reports.items():
        for case in report["cases"]:
            if verdict(case) in ("not_lossless", "error"):
                console.print(f"[bold]{release}[/] {case['generator']} {case['warpers']}: "
                              f"{case['verdict']}: {case['reason']}", highlight=False)


def _torch_versions(reports: dict[str, dict]) -> str:
    return ", ".join(sorted({r.get("torch_version", "?") for r in reports.values()}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", nargs="+", default=list(DEFAULT_RELEASES))
    parser.add_argument("--root", type=Path, default=Path("/tmp/lossless-compat"))
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--matrix", default="smoke")
    parser.add_argument("--scenario", default="markov8")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)

    reports, failed = {}, []
    for release in args.releases:
        print(f"== transformers {release}", file=sys.stderr, flush=True)
        try:
            python = ensure_venv(args.root, release)
        except subprocess.CalledProcessError as exc:
            failed.append(f"{release}: install failed ({exc})")
            continue
        report = args.root / f"{release}.json"
        report.unlink(missing_ok=True)
        done = run_release(python, report, args)
        if not report.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            failed.append(f"{release}: harness exited {done.returncode} without a report: {tail[0]}")
            continue
        reports[release] = json.loads(report.read_text())
    if reports:
        print_table(reports)
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
