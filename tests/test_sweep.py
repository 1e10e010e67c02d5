"""``lossless-check sweep`` and ``bisect``: release specs, the bisection, the compat table, and a real
bisection through cached per-release environments (built with uv from the package index)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lossless_check.errors import UsageError
from lossless_check.sweep import bisect, compat_table, parse_releases

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

    first, seen = bisect(verdict, AVAILABLE)
    assert first == AVAILABLE[change] and seen[first] == "lossless"
    assert len(looked) <= 2 + 3  # both ends, then log2(8) halvings


def test_bisect_without_a_change():
    assert bisect(lambda release: "lossless", AVAILABLE)[0] is None


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
