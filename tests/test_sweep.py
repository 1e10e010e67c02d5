"""``lossless-check sweep`` and ``bisect``: release specs, the bisection (never an answer it did not
observe), the compat table, what counts as a verdict, and real runs through cached per-release
environments (built from the package index) from a fresh virtualenv and from an empty directory."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lossless_check.errors import UsageError
from lossless_check.sweep import Failed, bisect, compat_table, parse_releases, run_in

ROOT = Path(__file__).resolve().parents[1]
AVAILABLE = ["4.57.1", "5.0.0", "5.14.0", "5.14.1", "5.15.0", "5.15.1", "5.16.0", "5.24.0"]


def test_release_specs():
    assert parse_releases("5.14.1..5.16.0", AVAILABLE) == ["5.14.1", "5.15.0", "5.15.1", "5.16.0"]
    assert parse_releases("5.24.0,5.0.0", AVAILABLE) == ["5.0.0", "5.24.0"]
    assert parse_releases("every", AVAILABLE) == AVAILABLE
    assert parse_releases("4.36.2..5.0.0", ["4.36.2", *AVAILABLE]) == ["4.57.1", "5.0.0"]
    for bad in ("5.14.2..5.16.0", "5.99.0", "5.16.0..5.14.1"):
        with pytest.raises(UsageError):
            parse_releases(bad, AVAILABLE)


def test_all_is_each_distinct_generation_code_of_each_minor():
    code = {"4.36.2": "a", "4.57.1": "a", "5.0.0": "b", "5.14.0": "c", "5.14.1": "d", "5.15.0": "d",
            "5.15.1": "d", "5.16.0": "e", "5.24.0": "e"}
    asked = []

    def digest(release):
        asked.append(release)
        return code[release]

    # 5.14.0 differs from 5.14.1, so both stay; 5.15.0 and 5.15.1 share their code, so only 5.15.1
    assert parse_releases("all", ["4.36.2", *AVAILABLE], digest) == [
        "4.57.1", "5.0.0", "5.14.0", "5.14.1", "5.15.1", "5.16.0", "5.24.0"]
    assert sorted(asked) == ["5.14.0", "5.14.1", "5.15.0", "5.15.1"]  # one-release minors need no download


@pytest.mark.parametrize("change", range(1, len(AVAILABLE)))
def test_bisect_finds_the_one_change_and_looks_at_few_releases(change):
    looked = []

    def verdict(release):
        looked.append(release)
        return "not_lossless" if AVAILABLE.index(release) < change else "lossless"

    found = bisect(verdict, AVAILABLE)
    assert found.first == AVAILABLE[change] and found.seen[found.first] == "lossless" and not found.no_answer
    assert len(looked) <= 2 + 3  # both ends, then log2(8) halvings


def test_bisect_without_a_change():
    found = bisect(lambda release: "lossless", AVAILABLE)
    assert found.first is None and not found.no_answer


@pytest.mark.parametrize("change", range(1, len(AVAILABLE)))
def test_bisect_names_only_a_boundary_it_observed(change):
    """Every set of failed releases: bisect names the change exactly when both releases around it gave
    verdicts (it steps over failures), and otherwise answers nothing, never a failure read as a verdict."""
    for failing in itertools.chain.from_iterable(itertools.combinations(AVAILABLE, k) for k in range(len(AVAILABLE) + 1)):
        def verdict(release):
            if release in failing:
                return Failed("exit 3: boom")
            return "not_lossless" if AVAILABLE.index(release) < change else "lossless"

        found = bisect(verdict, AVAILABLE)
        observable = AVAILABLE[change - 1] not in failing and AVAILABLE[change] not in failing
        ends_ran = AVAILABLE[0] not in failing and AVAILABLE[-1] not in failing
        if observable and ends_ran:
            assert found.first == AVAILABLE[change] and not found.no_answer, failing
        else:
            assert found.first is None and found.no_answer, failing


def _fake_python(tmp_path: Path, exit_code: int, report) -> Path:
    """An interpreter stand-in for :func:`run_in`: writes ``report`` (a dict, raw text, or nothing) to
    its ``--json`` path and exits ``exit_code`` (negative: killed by that signal)."""
    script = tmp_path / "python"
    script.write_text(f"""#!{sys.executable}
import json, os, signal, sys
path = sys.argv[sys.argv.index("--json") + 1]
report = {report!r}
if report is not None:
    open(path, "w").write(report if isinstance(report, str) else json.dumps(report))
sys.stderr.write("the last line\\n")
if {exit_code} < 0:
    os.kill(os.getpid(), -{exit_code})
sys.exit({exit_code})
""")
    script.chmod(0o755)
    return script


CASE = {"generator": "G", "warpers": "top_k=3", "verdict": "not_lossless"}
DONE = {"transformers_version": "5.15.0", "interrupted": False, "cases": [CASE]}


@pytest.mark.parametrize("exit_code, report, failure", [
    (1, DONE, None),
    (0, dict(DONE, cases=[dict(CASE, verdict="lossless")]), None),
    (2, None, "exit 2: the last line"),
    (3, DONE, "exit 3: the last line"),  # a report beside a harness bug is no verdict either
    (4, dict(DONE, interrupted=True, cases=[dict(CASE, verdict="unfinished")]), "exit 4: the last line"),
    (-9, None, "killed by signal 9: the last line"),
    (0, None, "exit 0, no readable report: the last line"),
    (1, "{\"cases\": [", "exit 1, no readable report: the last line"),
    (1, dict(DONE, transformers_version="5.24.0"), "the environment has transformers 5.24.0, not 5.15.0"),
    (1, dict(DONE, cases=[CASE, dict(CASE, verdict="unfinished")]), "an unfinished report (1 of 2 cases"),
    (1, dict(DONE, interrupted=True), "an unfinished report"),
    (0, dict(DONE, cases=[]), "an unfinished report (0 of 0"),
])
def test_only_a_finished_report_of_a_run_that_exited_0_or_1_is_a_verdict(tmp_path, exit_code, report, failure):
    doc = run_in(_fake_python(tmp_path, exit_code, report), "5.15.0", ["run"], tmp_path / "r.json", timeout=60)
    if failure is None:
        assert doc == report
    else:
        assert doc["failed"].startswith(failure), doc


def test_the_table_takes_its_reasons_from_the_reports():
    case = {"generator": "G", "verdict": "not_lossless", "reason": "L1 test rejects, TV 0.2 > 0.1 threshold"}
    results = {"5.0.0": {"step": {"cases": [dict(case, verdict="lossless", reason="")]}, "seconds": 1.0},
               "5.1.0": {"step": {"cases": [case]}, "seconds": 2.0},
               "5.2.0": {"step": {"failed": "exit 3, no report: boom"}, "seconds": 0.5}}
    table = compat_table(results, ["step"], "lossless-check sweep", {"step": ["run", "--matrix", "smoke"]})
    assert "| G | lossless | **NOT** 1/1 | failed |" in table
    assert f"- step / G / **NOT** 1/1 [5.1.0]: {case['reason']}" in table
    assert "- step / every generator / failed [5.2.0]: exit 3, no report: boom" in table


def test_reuse_keeps_only_finished_reports_of_the_same_run(tmp_path):
    """``sweep --reuse``: a release whose reports are finished runs of the same arguments is not run
    again (no environment is built: the unknown release would fail); any difference runs it."""
    import json

    from lossless_check.sweep import reusable_report, sweep
    from lossless_check.verifier_report import VERIFIER_NAME

    args = ["run", "--matrix", "smoke", "--mode", "step", "--seed", "0", "--samples", "1000"]
    stacks = {"none", "top_k=3"}
    doc = {"transformers_version": "0.0.1", "seed": 0, "samples": 1000, "interrupted": False,
           "cases": [{"generator": "G", "warpers": w, "verdict": "lossless"} for w in sorted(stacks)]
           + [{"generator": VERIFIER_NAME, "warpers": "-", "verdict": "lossless"}]}  # the run's verifier row
    report = tmp_path / "0.0.1-step.json"
    for change, kept in [({}, True), ({"seed": 1}, False), ({"samples": 300}, False), ({"interrupted": True}, False),
                         ({"transformers_version": "0.0.2"}, False), ({"cases": doc["cases"][:1]}, False)]:
        report.write_text(json.dumps({**doc, **change}))
        assert (reusable_report(report, "0.0.1", args, stacks) is not None) == kept, change
    report.write_text(json.dumps(doc))
    said = []
    results = sweep(["0.0.1"], ["step"], {"step": args}, tmp_path, tmp_path / "envs", say=said.append, reuse=stacks)
    assert results == {"0.0.1": {"step": doc, "seconds": None}} and said == [f"0.0.1: reused its reports in {tmp_path}"]
    assert "- wall time per release: 0.0.1 reused" in compat_table(results, ["step"], "c", {"step": args})


def test_bisect_names_the_release_that_fixed_mtp(tmp_path):
    """MTP of 5.14.x-5.15.0 returns raw logits while it samples processed ones (fixed in 5.15.1)."""
    envs = Path(os.environ.get("LOSSLESS_CHECK_ENVS", Path.home() / ".cache" / "lossless-check" / "envs"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "lossless_check.cli", "bisect", "--generator", "MTPCandidateGenerator",
                           "--warpers", "top_k=3", "--scenario", "iid8", "--releases", "5.14.1..5.16.0",
                           "--envs", str(envs), "--work", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("5.15.1: first release where the verdict changes"), done.stdout
    assert "5.15.0 not_lossless" in done.stdout and "5.15.1 lossless" in done.stdout
