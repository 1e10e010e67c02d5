"""``lossless-check sweep`` and ``bisect``: the release history, one environment per release.

Each release runs in its own virtual environment, built once and cached (``--envs``, default
``~/.cache/lossless-check/envs``): ``uv venv --system-site-packages`` over this interpreter (torch,
numpy, scipy and rich come from here), then ``uv pip install transformers==X`` (``venv`` and pip
where uv is missing). In it, this package (first on ``PYTHONPATH``) runs the public CLI and writes its
JSON report; nothing is read from a release but that report. The compat table's reasons are the
cases' own explanations, so the table is regenerated, never edited.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from itertools import groupby
from pathlib import Path

from .errors import UsageError

#: The oldest release the harness supports: the first with ``_speculative_sampling``.
FIRST_SUPPORTED = "4.37.0"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ENVS = Path.home() / ".cache" / "lossless-check" / "envs"
#: Digests of each release's ``transformers/generation`` sources, so a wheel is read once.
DIGESTS = Path.home() / ".cache" / "lossless-check" / "generation-digests.json"
#: A case reason that means the release lacks the class: its cell reads ``absent``.
ABSENT = "is not in the installed transformers"


def _version(release: str):
    from packaging.version import Version

    return Version(release)


def available_releases() -> list[str]:
    """Final transformers releases the package index serves, oldest first."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "transformers"],
                          capture_output=True, text=True, timeout=120)
    found = re.search(r"Available versions: (.+)", done.stdout)
    if not found:
        raise UsageError(f"cannot list transformers releases: {(done.stderr or done.stdout).strip()[:200]}")
    releases = [v.strip() for v in found.group(1).split(",")]
    return sorted((r for r in releases if not _version(r).is_prerelease), key=_version)


def generation_digest(release: str, cache: Path = DIGESTS) -> str:
    """A digest of ``transformers/generation/`` in ``release``'s wheel (downloaded once, without
    dependencies; the digest is cached in ``cache``)."""
    known = json.loads(cache.read_text()) if cache.exists() else {}
    if release not in known:
        with tempfile.TemporaryDirectory() as folder:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                                   "-d", folder, f"transformers=={release}"], capture_output=True, text=True)
            wheels = list(Path(folder).glob("*.whl"))
            if done.returncode or not wheels:
                raise UsageError(f"cannot download transformers {release}: {_last_line(done)}")
            digest = hashlib.sha256()
            with zipfile.ZipFile(wheels[0]) as wheel:
                for name in sorted(n for n in wheel.namelist() if n.startswith("transformers/generation/")):
                    digest.update(name.encode() + b"\0" + wheel.read(name))
        known = json.loads(cache.read_text()) if cache.exists() else {}  # another sweep may have added some
        known[release] = digest.hexdigest()
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(known, indent=1, sort_keys=True))
    return known[release]


def distinct_generation_code(releases: list[str], digest=generation_digest) -> list[str]:
    """Within each minor series, the newest patch of every run of patches with the same generation
    code: the newest patch of each minor, plus each older patch whose generation code a later patch
    changed. ``digest(release)`` is only asked for in series with more than one patch."""
    chosen = []
    for _, series in groupby(sorted(releases, key=_version), key=lambda r: _version(r).release[:2]):
        series = list(series)
        digests = [digest(r) for r in series] if len(series) > 1 else [None]
        chosen += [list(run)[-1][0] for _, run in groupby(zip(series, digests), key=lambda pair: pair[1])]
    return chosen


def parse_releases(spec: str, available: list[str] | None = None, digest=generation_digest) -> list[str]:
    """``all`` (since :data:`FIRST_SUPPORTED`, each distinct generation code once:
    :func:`distinct_generation_code`), ``every`` (every release since then), ``A..B`` (every release
    from A to B), or ``A,B,...``; oldest first, each checked against the index."""
    available = available if available is not None else available_releases()
    supported = [r for r in available if _version(r) >= _version(FIRST_SUPPORTED)]
    if spec == "every":
        return supported
    if spec == "all":
        return distinct_generation_code(supported, digest)
    if ".." in spec:
        low, high = (part.strip() for part in spec.split("..", 1))
        for end in (low, high):
            if end not in available:
                raise UsageError(f"transformers {end} is not on the package index")
        chosen = [r for r in supported if _version(low) <= _version(r) <= _version(high)]
    else:
        chosen = [r.strip() for r in spec.split(",") if r.strip()]
        missing = [r for r in chosen if r not in available]
        if missing:
            raise UsageError(f"transformers {', '.join(missing)} not on the package index")
    if not chosen:
        raise UsageError(f"no release in {spec!r}")
    return sorted(set(chosen), key=_version)


def environment(release: str, envs: Path = DEFAULT_ENVS) -> Path:
    """The interpreter of ``release``'s environment (built on first use); this interpreter if its
    transformers is that release. Raises :class:`RuntimeError` with the installer's last line."""
    import transformers

    if transformers.__version__ == release:
        return Path(sys.executable)
    home = envs / f"tf-{release}"
    python = home / "bin" / "python"
    if python.exists():
        return python
    uv = shutil.which("uv")
    steps = ([[uv, "venv", "-q", "--system-site-packages", "--python", sys.executable, str(home)],
              [uv, "pip", "install", "-q", "--python", str(python), f"transformers=={release}"]] if uv else
             [[sys.executable, "-m", "venv", "--system-site-packages", str(home)],
              [str(python), "-m", "pip", "install", "-q", f"transformers=={release}"]])
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode:
            shutil.rmtree(home, ignore_errors=True)
            raise RuntimeError(f"building the environment of {release} failed: {_last_line(done)}")
    return python


def run_in(python: Path, release: str, args: list[str], report: Path, timeout: float) -> dict:
    """``lossless-check ARGS --json REPORT`` in ``python``'s environment; the report, or ``{"failed": why}``."""
    report.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT), OMP_NUM_THREADS="1")
    try:  # exit 1 (a case not lossless) is a result, not a failure
        done = subprocess.run([str(python), "-m", "lossless_check.cli", *args, "--json", str(report), "--quiet"],
                              env=env, cwd=PACKAGE_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout:g} s"}
    try:
        doc = json.loads(report.read_text())
    except (OSError, ValueError):
        return {"failed": f"exit {done.returncode}, no report: {_last_line(done)}"}
    if doc.get("transformers_version") != release:
        return {"failed": f"the environment has transformers {doc.get('transformers_version')}, not {release}"}
    return doc


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = (done.stderr or done.stdout or "no output").strip().splitlines()
    return lines[-1] if lines else "no output"


def sweep_release(release: str, modes: list[str], run_args: dict[str, list[str]], work: Path,
                  envs: Path = DEFAULT_ENVS, timeout: float = 1800) -> dict:
    """``{mode: report or {"failed": why}, "seconds": wall}`` of one release: its environment (built on
    first use), then ``run_args[mode]`` there for each mode, each report written under ``work``."""
    started = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    try:
        python = environment(release, envs)
    except RuntimeError as exc:
        python, why = None, str(exc)
    result: dict = {mode: (run_in(python, release, run_args[mode], work / f"{release}-{mode}.json", timeout)
                           if python else {"failed": why}) for mode in modes}
    result["seconds"] = time.monotonic() - started
    return result


def reusable_report(path: Path, release: str, args: list[str], stacks: set[str]) -> dict | None:
    """The report at ``path`` if it is a finished run of ``args`` (``run --matrix M ... --seed S
    --samples N``) on ``release``: same release, seed and samples, not interrupted, and its cases' warper
    stacks those of the matrix (``stacks``, formatted); else ``None``."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    wanted = {"transformers_version": release, "seed": int(args[args.index("--seed") + 1]),
              "samples": int(args[args.index("--samples") + 1]), "interrupted": False}
    if any(doc.get(key) != value for key, value in wanted.items()):
        return None
    from .verifier_report import VERIFIER_NAME

    ran = {c.get("warpers") for c in doc.get("cases", []) if c.get("generator") != VERIFIER_NAME}
    return doc if ran == stacks else None


def sweep(releases: list[str], modes: list[str], run_args: dict[str, list[str]], work: Path,
          envs: Path = DEFAULT_ENVS, timeout: float = 1800, say=print, backend: str = "local",
          address: str | None = None, workers: int = 1, reuse: set[str] | None = None,
          resume: bool = False) -> dict[str, dict]:
    """``{release: {mode: report or {"failed": why}, "seconds": wall}}``: ``run_args[mode]`` run in
    every release's environment (:func:`sweep_release`): ``workers`` releases at once on the local
    pool (default: one after another, here), or with ``backend="ray"`` a Ray task per release
    (``address``: an existing cluster), each using the environments cached on its node. The results
    are the same either way. ``reuse``: the matrix's warper stacks (formatted); a release whose every
    mode has a :func:`reusable_report` in ``work`` is not run again (its wall time reads ``reused``).
    ``resume``: a run that left a journal in ``work`` (killed, or interrupted) goes on from it
    (``run --resume``: its finished cases and chunks are not run again)."""
    from .engine import make_engine

    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    if reuse is not None:
        for release in releases:
            kept = {mode: reusable_report(work / f"{release}-{mode}.json", release, run_args[mode], reuse)
                    for mode in modes}
            if all(kept.values()):
                results[release] = {**kept, "seconds": None}
                say(f"{release}: reused its reports in {work}")
    to_run = [r for r in releases if r not in results]

    def finished(index: int, result: dict) -> None:
        release = to_run[index]
        results[release] = result
        for mode in modes:  # a node that does not share this file system wrote the report on its own
            report = work / f"{release}-{mode}.json"
            if "failed" not in result[mode] and not report.exists():
                report.write_text(json.dumps(result[mode], indent=2))
        say(f"{release}: {result['seconds']:.0f} s")

    def arguments(release: str) -> dict[str, list[str]]:
        from .journal import journal_for

        kept = {mode for mode in modes if resume and journal_for(work / f"{release}-{mode}.json").exists()}
        return {mode: run_args[mode] + (["--resume"] if mode in kept else []) for mode in modes}

    with make_engine(workers, backend, address) as engine:
        engine.map(sweep_release, [(r, modes, arguments(r), work, envs, timeout) for r in to_run], finished=finished)
    return {release: results[release] for release in releases}


def cell(cases: list[dict]) -> tuple[str, str]:
    """``(text, reason)``: the verdict of one generator's cases in one release and mode, and the first
    reason behind it (``absent``: the release lacks the class)."""
    if not cases:
        return "absent", "not in this run's report"
    if all(c["verdict"] == "skipped" and ABSENT in (c.get("reason") or "") for c in cases):
        return "absent", ""
    for verdict in ("not_lossless", "error", "vacuous", "skipped"):
        hits = [c for c in cases if c["verdict"] == verdict]
        if hits:
            label = "**NOT**" if verdict == "not_lossless" else verdict
            count = f" {len(hits)}/{len(cases)}" if verdict != "skipped" or len(hits) < len(cases) else ""
            return label + count, hits[0].get("reason") or "(no reason given)"
    return "lossless", ""


def compat_table(results: dict[str, dict], modes: list[str], command: str, run_args: dict[str, list[str]]) -> str:
    """The release x generator x mode table in Markdown, then each cell that is not ``lossless`` with
    the first case reason behind it (cells alike in mode, generator, verdict and reason share a line)."""
    releases = sorted(results, key=_version)
    lines = ["# Compat table: lossless-check verdicts by transformers release", "",
             f"- date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
             f"- command: `{command}`"]
    lines += [f"- {mode}: `lossless-check {shlex.join(run_args[mode])}`" for mode in modes]
    lines += ["- wall time per release: " + ", ".join(
        f"{r} {'reused' if results[r]['seconds'] is None else format(results[r]['seconds'], '.0f') + 's'}"
        for r in releases), "",
              "Cells: `lossless` (every case), `**NOT** k/n` (k of n cases not lossless), `error k/n`, `vacuous k/n`, "
              "`skipped`, `absent` (no such class in the release), `failed` (the run gave no report).", ""]
    notes: dict[tuple[str, str, str, str], list[str]] = {}
    generators = list(dict.fromkeys(c["generator"] for r in releases for m in modes
                                    for c in results[r][m].get("cases", []))) or ["(no report)"]
    for mode in modes:
        lines += [f"## mode: {mode}", "", "| generator | " + " | ".join(releases) + " |",
                  "|---" * (len(releases) + 1) + "|"]
        for generator in generators:
            row = []
            for release in releases:
                report = results[release][mode]
                if "failed" in report:
                    notes.setdefault((mode, "every generator", "failed", report["failed"]), []).append(release)
                    row.append("failed")
                    continue
                text, reason = cell([c for c in report["cases"] if c["generator"] == generator])
                row.append(text)
                if text not in ("lossless", "absent") or reason:
                    notes.setdefault((mode, generator, text, reason), []).append(release)
            lines.append(f"| {generator} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Cells that are not lossless, with the first reason", ""]
    lines += [f"- {mode} / {generator} / {text} [{', '.join(rels)}]: {reason}"
              for (mode, generator, text, reason), rels in notes.items()]
    return "\n".join(lines) + "\n"


def bisect(verdict_at, releases: list[str]) -> tuple[str | None, dict[str, str]]:
    """The first release whose verdict differs from the oldest's (``None`` if the newest agrees), and
    every verdict looked at. ``verdict_at(release)`` gives one; binary search assumes one change."""
    seen = {releases[0]: verdict_at(releases[0]), releases[-1]: verdict_at(releases[-1])}
    if seen[releases[-1]] == seen[releases[0]]:
        return None, seen
    low, high = 0, len(releases) - 1  # verdict at low is the oldest's, at high it is not
    while high - low > 1:
        mid = (low + high) // 2
        seen[releases[mid]] = verdict_at(releases[mid])
        low, high = (mid, high) if seen[releases[mid]] == seen[releases[0]] else (low, mid)
    return releases[high], seen


def case_verdict(release: str, args: list[str], work: Path, envs: Path = DEFAULT_ENVS, timeout: float = 1800) -> str:
    """The verdict of the one case ``args`` names in ``release`` (``failed: why`` without a report)."""
    try:
        python = environment(release, envs)
    except RuntimeError as exc:
        return f"failed: {exc}"
    work.mkdir(parents=True, exist_ok=True)
    doc = run_in(python, release, args, work / f"bisect-{release}.json", timeout)
    if "failed" in doc:
        return f"failed: {doc['failed']}"
    return ", ".join(sorted({c["verdict"] for c in doc["cases"]}))


def add_history_commands(sub, matrices, default_scenario: str, default_samples: int) -> None:
    """The ``sweep`` and ``bisect`` subcommands of the CLI."""
    from .options import positive_int

    sweep = sub.add_parser("sweep", help="the compat table: a run per release and mode, each release in its own "
                                         "cached environment")
    sweep.add_argument("--releases", required=True, metavar="SPEC",
                       help=f"all (since {FIRST_SUPPORTED}: the newest patch of each minor, plus older patches "
                            "whose generation code a later patch changed), every (every release since "
                            f"{FIRST_SUPPORTED}), A..B (every release from A to B), or A,B,...")
    sweep.add_argument("--modes", nargs="+", default=["step", "generate", "provenance"],
                       choices=["step", "generate", "provenance"])
    sweep.add_argument("--matrix", choices=matrices, default="smoke")
    sweep.add_argument("--samples", type=positive_int, default=1000, help="trials per case (default 1000)")
    sweep.add_argument("--generate-samples", type=positive_int, default=300,
                       help="trials per generate-mode case (default 300)")
    sweep.add_argument("--seed", type=int, default=0)
    sweep.add_argument("--envs", default=None, metavar="DIR",
                       help="where release environments are kept (default ~/.cache/lossless-check/envs)")
    sweep.add_argument("--work", default="lossless-sweep", metavar="DIR", help="each release's JSON reports")
    sweep.add_argument("--out", default="compat_table.md", metavar="PATH", help="the table (Markdown)")
    sweep.add_argument("--reuse", action="store_true",
                       help="keep a release's reports in --work when each is a finished run of these arguments "
                            "(release, seed, samples, the matrix's stacks), e.g. after an interrupted sweep; delete "
                            "the reports of releases whose results this checkout would change")
    sweep.add_argument("--resume", action="store_true",
                       help="continue an interrupted sweep with the same arguments: --reuse, and each release's run "
                            "that was cut short goes on from the finished cases and chunks its journal in --work keeps")
    sweep.add_argument("--timeout", type=positive_int, default=1800, metavar="S", help="seconds per release and mode")
    sweep.add_argument("--backend", choices=("local", "ray"), default="local",
                       help="where releases run: one after another here (default), or a Ray task per release")
    sweep.add_argument("--address", default=None, metavar="HOST:PORT",
                       help="--backend ray: the cluster to join (default: a local Ray instance of --workers CPUs)")
    sweep.add_argument("--workers", type=positive_int, default=1,
                       help="releases run at once without --address (default 1: one after another)")
    bisect = sub.add_parser("bisect", help="the first release in a range where one case's verdict changes")
    bisect.add_argument("--generator", required=True, metavar="NAME|module:attr")
    bisect.add_argument("--warpers", default="none", metavar="k=v,k=v")
    bisect.add_argument("--releases", required=True, metavar="A..B")
    bisect.add_argument("--mode", choices=("step", "provenance", "generate"), default="step")
    bisect.add_argument("--scenario", default=default_scenario)
    bisect.add_argument("--samples", type=positive_int, default=default_samples)
    bisect.add_argument("--seed", type=int, default=0)
    bisect.add_argument("--envs", default=None, metavar="DIR")
    bisect.add_argument("--work", default="lossless-bisect", metavar="DIR", help="each release's JSON report")


def check_history_paths(args, precheck) -> None:
    """The paths ``sweep`` and ``bisect`` write, and ``bisect``'s case, checked before any work."""
    from .journal import check_writable_dir, check_writable_file

    check_writable_dir(args.work, "--work")
    if args.envs:
        check_writable_dir(args.envs, "--envs")
    if args.command == "sweep":
        from .cli import check_backend

        check_writable_file(args.out, "--out")
        check_backend(args)
    else:
        precheck(argparse.Namespace(generator=[args.generator], warpers=[args.warpers], scenario=args.scenario,
                                     command="bisect"))


def history_command(args) -> int:
    """``sweep``: the compat table (exit 1 when a release gave no report); ``bisect``: the first release
    where the verdict changes (exit 0 whether or not it changes)."""
    envs = Path(args.envs) if args.envs else DEFAULT_ENVS
    releases = parse_releases(args.releases)
    if args.command == "sweep":
        run_args = {mode: ["run", "--matrix", args.matrix, "--mode", mode, "--seed", str(args.seed), "--samples",
                           str(args.generate_samples if mode == "generate" else args.samples)] for mode in args.modes}
        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        reuse = None
        if args.reuse or args.resume:
            from .matrix import matrix
            from .warpers import format_warpers

            reuse = {format_warpers(stack) for stack in matrix(args.matrix)}
        try:
            results = sweep(releases, args.modes, run_args, Path(args.work), envs, args.timeout, say, args.backend,
                            args.address, args.workers, reuse, args.resume)
        except KeyboardInterrupt:
            print(f"lossless-check: interrupted: each finished release's reports, and the journal of each run cut "
                  f"short, are in {args.work}; the same command with --resume continues", file=sys.stderr)
            return 4
        command = "lossless-check " + " ".join(sys.argv[1:])
        Path(args.out).write_text(compat_table(results, args.modes, command, run_args))
        failed = [f"{r} {m}: {res[m]['failed']}" for r, res in results.items() for m in args.modes if "failed" in res[m]]
        for line in failed:
            print(f"FAILED {line}", file=sys.stderr)
        print(f"wrote {args.out} ({len(releases)} releases x {len(args.modes)} modes)")
        return 1 if failed else 0
    case = ["run", "--generator", args.generator, "--warpers", args.warpers, "--mode", args.mode, "--scenario",
            args.scenario, "--samples", str(args.samples), "--seed", str(args.seed), "--no-verifier"]
    first, seen = bisect(lambda release: case_verdict(release, case, Path(args.work), envs), releases)
    looked = ", ".join(f"{r} {seen[r]}" for r in releases if r in seen)
    if first is None:
        print(f"no change in {releases[0]}..{releases[-1]}: {looked}")
    else:
        print(f"{first}: first release where the verdict changes; looked at {looked}")
    return 0
