"""Compat job: a release x generator x mode verdict table, one transformers release per venv.

    python benchmarks/compat.py [--releases 5.0.0 5.24.0 ...] [--venvs /tmp/venvs] [--create]
                                [--samples 1000] [--modes step generate provenance]
                                [--timeout 1800] [--jobs 1] [--out benchmarks/compat_table.md]

Releases: every ``VENVS/tf-<release>`` venv, or ``--releases``. A release without a venv runs in
this interpreter if its transformers is that release; otherwise ``--create`` makes the venv
(``python -m venv --system-site-packages`` -- torch, numpy, scipy, rich and this editable checkout
come from here -- then ``pip install transformers==<release>``), else its cells say why not.

For each release and mode this runs the public CLI in the release's venv, this checkout first on
``PYTHONPATH``:  ``python -m lossless_check run --matrix smoke --mode M --samples N --json OUT``
(every built-in generator), and reads the JSON report. A cell aggregates a generator's smoke cases:
``absent`` (the class is not in that release), ``NOT k/n`` if any case is not lossless, else
``error``/``skipped`` if any is, else ``lossless``. Releases run one at a time (``--jobs 2`` at most),
each within ``--timeout`` seconds; a release that fails becomes ``failed`` cells with the reason.
Writes Markdown (one table per mode, then the reason for every cell that is not ``lossless``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
ABSENT = "is not in the installed transformers"  # the CLI's reason for a class a release lacks


def find_python(release: str, venvs: Path, create: bool) -> tuple[Path | None, str]:
    """The interpreter for ``release``, or None and why there is none."""
    python = venvs / f"tf-{release}" / "bin" / "python"
    if python.exists():
        return python, ""
    import transformers
    if transformers.__version__ == release:
        return Path(sys.executable), ""
    if not create:
        return None, f"no venv {python.parent.parent} (--create makes it)"
    steps = [[sys.executable, "-m", "venv", "--system-site-packages", str(python.parent.parent)],
             [str(python), "-m", "pip", "install", "-q", f"transformers=={release}"]]
    for step in steps:  # a release whose requirements would upgrade torch fails on the pip constraint
        done = subprocess.run(["nice", *step], capture_output=True, text=True)
        if done.returncode:
            return None, f"venv creation failed: {_last_line(done)}"
    return python, ""


def run_release(release: str, args) -> dict:
    """``{mode: report dict, or {"failed": reason}}`` for one release, plus its wall time."""
    start = time.monotonic()
    python, why = find_python(release, args.venvs, args.create)
    results: dict = {}
    for mode in args.modes:
        left = args.timeout - (time.monotonic() - start)
        if python is None or left <= 0:
            results[mode] = {"failed": why or f"release timeout ({args.timeout}s) spent before this mode"}
            continue
        report = args.work / f"{release}-{mode}.json"
        if args.reuse and report.exists():  # a report from an earlier run of the same job
            results[mode] = json.loads(report.read_text())
            continue
        report.unlink(missing_ok=True)
        command = [str(python), "-m", "lossless_check", "run", "--matrix", args.matrix, "--mode", mode,
                   "--samples", str(args.generate_samples if mode == "generate" else args.samples), "--seed", str(args.seed), "--json", str(report), "--quiet"]
        env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        try:  # exit 1 (some case not lossless) is a result, not a failure
            done = subprocess.run(["nice", *command], env=env, cwd=args.work, capture_output=True,
                                  text=True, timeout=left)
        except subprocess.TimeoutExpired:
            results[mode] = {"failed": f"timed out (release timeout {args.timeout}s)"}
            continue
        try:
            results[mode] = json.loads(report.read_text())
        except (OSError, ValueError) as exc:
            results[mode] = {"failed": f"exit {done.returncode}, no readable report ({type(exc).__name__}): "
                                       f"{_last_line(done)}"}
            continue
        got = results[mode].get("transformers_version")
        if got != release:
            results[mode] = {"failed": f"venv has transformers {got}, not {release}"}
    results["seconds"] = time.monotonic() - start
    print(f"{release}: {results['seconds']:.0f}s", file=sys.stderr, flush=True)
    return results


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = (done.stderr or done.stdout or "no output").strip().splitlines()
    return lines[-1] if lines else "no output"


def cell(cases: list[dict]) -> tuple[str, str]:
    """``(text, reason)``: the aggregated verdict of one generator's cases and the first reason behind it."""
    if not cases:
        return "absent", "not in this run's report"
    if all(c["verdict"] == "skipped" and ABSENT in (c.get("reason") or "") for c in cases):
        return "absent", ""
    for verdict in ("not_lossless", "error", "skipped", "vacuous"):
        hits = [c for c in cases if c["verdict"] == verdict]
        if hits:
            label = "**NOT**" if verdict == "not_lossless" else verdict
            count = f" {len(hits)}/{len(cases)}" if verdict != "skipped" or len(hits) < len(cases) else ""
            return label + count, hits[0].get("reason") or "(no reason given)"
    return "lossless", ""


def write_table(results: dict[str, dict], args, out: Path) -> None:
    releases = sorted(results, key=Version)
    torches = {r["torch_version"] for res in results.values() for m, r in res.items() if m in args.modes
               and "torch_version" in r}
    lines = ["# Compat table: lossless_check verdicts by transformers release", "",
             f"- date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
             f"- command: `{shlex.join(['python', *sys.argv])}`",
             f"- per release and mode: `python -m lossless_check run --matrix {args.matrix} --mode MODE "
             f"--samples {args.samples} --seed {args.seed} --json OUT --quiet`",
             f"- samples per case: {args.samples} (generate mode: {args.generate_samples}); matrix: {args.matrix} "
             "(cases per cell: its warper stacks)",
             f"- torch: {', '.join(sorted(torches)) or '?'}",
             "- wall time per release: " + ", ".join(f"{r} {results[r]['seconds']:.0f}s" for r in releases),
             "", "Cells: `lossless` (every case), `**NOT** k/n` (k of n cases not lossless), `error k/n`, "
             "`skipped`, `absent` (no such class in the release), `failed` (the run gave no report).", ""]
    notes: dict[tuple[str, str, str, str], list[str]] = {}
    generators = list(dict.fromkeys(c["generator"] for r in releases for m in args.modes
                                    for c in results[r][m].get("cases", []))) or ["(no report)"]
    for mode in args.modes:
        lines += [f"## mode: {mode}", "", "| generator | " + " | ".join(releases) + " |",
                  "|---" * (len(releases) + 1) + "|"]
        for generator in generators:
            row = []
            for release in releases:
                report = results[release][mode]
                if "failed" in report:  # one note for the whole run, not one per generator
                    _note(notes, (mode, "every generator", "failed", report["failed"]), release)
                    row.append("failed")
                    continue
                text, reason = cell([c for c in report["cases"] if c["generator"] == generator])
                row.append(text)
                if text not in ("lossless", "absent") or reason:
                    _note(notes, (mode, generator, text, reason), release)
            lines.append(f"| {generator} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Cells that are not lossless, with the first reason", ""]
    lines += [f"- {mode} / {generator} / {text} [{', '.join(rels)}]: {reason}"
              for (mode, generator, text, reason), rels in notes.items()]
    out.write_text("\n".join(lines) + "\n")


def _note(notes: dict, key: tuple, release: str) -> None:
    """Cells with the same mode, generator, verdict and reason share one line listing their releases."""
    if release not in notes.setdefault(key, []):
        notes[key].append(release)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", nargs="+", help="default: every VENVS/tf-<release>")
    parser.add_argument("--venvs", type=Path, default=Path("/tmp/venvs"))
    parser.add_argument("--create", action="store_true", help="make a missing release's venv")
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--modes", nargs="+", default=["step", "generate", "provenance"],
                        choices=["step", "generate", "provenance"])
    parser.add_argument("--matrix", default="smoke")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per release, all modes")
    parser.add_argument("--jobs", type=int, default=1, choices=[1, 2], help="releases run in parallel")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lossless-compat"), help="JSON reports")
    parser.add_argument("--generate-samples", type=int, default=300,
                        help="samples per generate-mode case (the real loop is ~20x slower than step mode)")
    parser.add_argument("--reuse", action="store_true",
                        help="take a release x mode report already in --work instead of running it again")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "compat_table.md")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    releases = args.releases or [p.name.removeprefix("tf-") for p in args.venvs.glob("tf-*")
                                 if (p / "bin" / "python").exists()]
    if not releases:
        parser.error(f"no venvs under {args.venvs}; give --releases")
    releases = sorted(set(releases), key=Version)

    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(releases, pool.map(lambda r: run_release(r, args), releases)))
    write_table(results, args, args.out)
    failed = [f"{r} {m}: {res[m]['failed']}" for r, res in results.items() for m in args.modes if "failed" in res[m]]
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
