"""``lossless-check sweep`` and ``bisect``: the release history, one environment per release.

Each release runs in its own cached environment (:mod:`lossless_check.history.release_env`). In it, the
public CLI runs and writes its JSON report; nothing is read from a release but that report, and only
a finished report of that release, from a run that exited 0 or 1, is a verdict: anything else (an
environment that could not be built, another exit, a crash, no report, an unreadable or interrupted
one) is that release's failure, with its reason, never a verdict. The compat table's reasons are the
cases' own explanations, so the table is regenerated, never edited.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
import zipfile
from itertools import groupby
from pathlib import Path

from lossless_check.core.compat import ABSENT
from lossless_check.core.errors import UsageError
from lossless_check.history.release_env import child_environ, environment, last_line

#: The oldest release the harness supports: the first with ``_speculative_sampling``.
FIRST_SUPPORTED = "4.37.0"
#: Digests of each release's ``transformers/generation`` sources, so a wheel is read once.
DIGESTS = Path.home() / ".cache" / "lossless-check" / "generation-digests.json"


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
                raise UsageError(f"cannot download transformers {release}: {last_line(done)}")
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


def run_in(python: Path, release: str, args: list[str], report: Path, timeout: float) -> dict:
    """``lossless-check ARGS --json REPORT`` in ``python``'s environment, from this directory (a
    ``module:attr`` generator is found as in a run here); the report, or ``{"failed": why}`` unless it
    is a finished report of ``release`` from a run that exited 0 or 1 (exit 1, a case not lossless, is
    a result)."""
    report = report.resolve()
    report.unlink(missing_ok=True)
    try:
        done = subprocess.run([str(python), "-m", "lossless_check.faces.cli", *args, "--json", str(report), "--quiet"],
                              env=child_environ(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {timeout:g} s"}
    except OSError as exc:
        return {"failed": f"cannot start {python}: {exc}"}
    if done.returncode not in (0, 1):
        how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        return {"failed": f"{how}: {last_line(done)}"}
    try:
        doc = json.loads(report.read_text())
        cases = doc["cases"]
    except (OSError, ValueError, KeyError, TypeError):
        return {"failed": f"exit {done.returncode}, no readable report: {last_line(done)}"}
    if doc.get("transformers_version") != release:
        return {"failed": f"the environment has transformers {doc.get('transformers_version')}, not {release}"}
    from lossless_check.evidence.results import VERDICTS

    unfinished = [c for c in cases if c.get("verdict") not in VERDICTS or c["verdict"] == "unfinished"]
    if doc.get("interrupted") or unfinished or not cases:
        return {"failed": f"an unfinished report ({len(unfinished)} of {len(cases)} cases without a verdict)"}
    return doc


def sweep_release(release: str, modes: list[str], run_args: dict[str, list[str]], work: Path,
                  envs: Path | None = None, timeout: float = 1800) -> dict:
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
    from lossless_check.outputs.verifier_report import VERIFIER_NAME

    ran = {c.get("warpers") for c in doc.get("cases", []) if c.get("generator") != VERIFIER_NAME}
    return doc if ran == stacks else None


def sweep(releases: list[str], modes: list[str], run_args: dict[str, list[str]], work: Path,
          envs: Path | None = None, timeout: float = 1800, say=print, backend: str = "local",
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
    from lossless_check.running.engine import make_engine

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
        failures = [f"{mode} failed ({result[mode]['failed']})" for mode in modes if "failed" in result[mode]]
        say(f"{release}: {result['seconds']:.0f} s" + (": " + "; ".join(failures) if failures else ""))

    def arguments(release: str) -> dict[str, list[str]]:
        from lossless_check.running.journal import journal_for

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


def _row(case: dict) -> str:
    """The table row of a case: its generator, or on a stateful target (``markov8-linear`` ...) the generator
    and the scenario (``G (markov8-linear)``): a row of its own, whose verdicts are not mixed into the generator's."""
    from lossless_check.laws.scenarios import STATEFUL

    stateful = case.get("scenario") in {s.name for s in STATEFUL.values()}
    return f"{case['generator']} ({case['scenario']})" if stateful else case["generator"]


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
              "`skipped`, `absent` (no such class in the release), `failed` (no verdict: the run failed, for the "
              "reason below).", ""]
    notes: dict[tuple[str, str, str, str], list[str]] = {}
    generators = list(dict.fromkeys(_row(c) for r in releases for m in modes
                                    for c in results[r][m].get("cases", []))) or ["(no report)"]
    # A run over the whole install adds greedy rows (lossless_check.faces.api.greedy_cases): their own section,
    # read from the first mode whose reports hold them, never mixed into that mode's cells.
    sections = [(mode, mode, False) for mode in modes]
    holding = [m for m in modes
               if any(c.get("mode") == "greedy" for r in releases for c in results[r][m].get("cases", []))]
    if holding:
        sections.append((f"greedy (rows of the {holding[0]} runs)", holding[0], True))
    for title, mode, greedy in sections:
        lines += [f"## mode: {title}", "", "| generator | " + " | ".join(releases) + " |",
                  "|---" * (len(releases) + 1) + "|"]
        for generator in generators:
            row = []
            for release in releases:
                report = results[release][mode]
                if "failed" in report:
                    notes.setdefault((title, "every generator", "failed", report["failed"]), []).append(release)
                    row.append("failed")
                    continue
                text, reason = cell([c for c in report["cases"] if _row(c) == generator
                                     and (c.get("mode") == "greedy") == greedy])
                row.append(text)
                if text not in ("lossless", "absent") or reason:
                    notes.setdefault((title, generator, text, reason), []).append(release)
            lines.append(f"| {generator} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Cells that are not lossless, with the first reason", ""]
    lines += [f"- {mode} / {generator} / {text} [{', '.join(rels)}]: {reason}"
              for (mode, generator, text, reason), rels in notes.items()]
    return "\n".join(lines) + "\n"
