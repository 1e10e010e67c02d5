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

from lossless_check.core.errors import UsageError
from lossless_check.history.bisect import Failed, bisect
from lossless_check.history.sweep import compat_table, parse_releases, run_in

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
    subsets = (itertools.combinations(AVAILABLE, k) for k in range(len(AVAILABLE) + 1))
    for failing in itertools.chain.from_iterable(subsets):
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


def test_stateful_targets_have_rows_of_their_own():
    """A generator's rows on the stateful targets (markov8-linear ...) are not mixed into its markov8 row."""
    plain = {"generator": "G", "scenario": "markov8", "verdict": "lossless", "reason": ""}
    linear = {"generator": "G", "scenario": "markov8-linear", "verdict": "not_lossless", "reason": "rejects"}
    skipped = dict(linear, verdict="skipped", reason="not applicable: refused")
    results = {"5.24.0": {"generate": {"cases": [plain, skipped]}, "seconds": 1.0},
               "5.25.0": {"generate": {"cases": [plain, linear]}, "seconds": 1.0}}
    table = compat_table(results, ["generate"], "c", {"generate": ["run", "--mode", "generate"]})
    assert "| G | lossless | lossless |" in table
    assert "| G (markov8-linear) | skipped | **NOT** 1/1 |" in table


def test_reuse_keeps_only_finished_reports_of_the_same_run(tmp_path):
    """``sweep --reuse``: a release whose reports are finished runs of the same arguments is not run
    again (no environment is built: the unknown release would fail); any difference runs it."""
    from lossless_check.history.sweep import reusable_report, sweep
    from lossless_check.outputs.verifier_report import VERIFIER_NAME

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


def _uv() -> str | None:
    return shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))


def _virtualenv(home: Path, *installs: list[str]) -> Path:
    """A new virtualenv at ``home`` (what was there is removed), pip in it, each of ``installs`` (pip
    arguments) installed there; its interpreter. uv builds it when it is here (from uv's cache, 3 s; the
    first time 17 s for torch), else, or if uv cannot (it does not read pip's configuration: its
    find-links are passed on from ``$PIP_FIND_LINKS``, nothing else), venv and pip (80 s measured:
    torch is unpacked each time)."""
    python = home / "bin" / "python"
    uv = _uv()
    links = [f"--find-links={link}" for link in os.environ.get("PIP_FIND_LINKS", "").split()]
    ways = [[[uv, "venv", "-q", "--seed", "--python", sys.executable, str(home)],
             *([uv, "pip", "install", "-q", "--python", str(python), *links, *args] for args in installs)]
            ] if uv else []
    ways.append([[sys.executable, "-m", "venv", str(home)],
                 *([str(python), "-m", "pip", "install", "-q", *args] for args in installs)])
    for commands in ways:
        shutil.rmtree(home, ignore_errors=True)
        for command in commands:
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
            if done.returncode:
                break
        else:
            return python
    raise AssertionError(f"cannot build a virtualenv at {home}: {done.stderr[-2000:]}")


def _versions() -> tuple[str, str]:
    import importlib.metadata

    return importlib.metadata.version("torch"), importlib.metadata.version("transformers")


def _clean_environ() -> dict[str, str]:
    """Variables for a command that runs as a user would: nothing of this test run on its path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


MTP_BISECT = ["bisect", "--generator", "MTPCandidateGenerator", "--warpers", "top_k=3", "--scenario", "iid8"]


# heavy (.ci/run's first step; issue 41): installs and runs three releases (100 s in the suite).
@pytest.mark.heavy
def test_bisect_names_the_release_that_fixed_mtp(tmp_path):
    """MTP of 5.14.x-5.15.0 returns raw logits while it samples processed ones (fixed in 5.15.1). Run as a
    user would: from an empty directory, by a fresh virtualenv that alone holds torch and the harness
    (the release environments must see its packages, not the base interpreter's), with the product's
    environment cache (``$LOSSLESS_CHECK_ENVS`` or ``~/.cache/lossless-check/envs``, kept between runs)."""
    from lossless_check.history.release_env import default_envs

    torch, transformers = _versions()
    import hashlib

    home = default_envs().parent / "test-venvs" / f"harness-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:10]}"
    python = _virtualenv(home, [f"torch=={torch}", f"transformers=={transformers}", "-e", str(ROOT)])
    done = subprocess.run([str(python), "-m", "lossless_check.faces.cli", *MTP_BISECT, "--releases", "5.14.1..5.16.0"],
                          cwd=tmp_path, env=_clean_environ(), capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("5.15.1: first release where the verdict changes"), done.stdout + done.stderr
    assert "5.15.0 not_lossless" in done.stdout and "5.15.1 lossless" in done.stdout
    assert (tmp_path / "lossless-bisect" / "bisect-5.15.1.json").exists()  # made in the user's directory


UNINSTALLABLE = "4.0.0"  # its tokenizers 0.9.4 has no wheel for this Python and does not build


@pytest.mark.parametrize("command", ["bisect", "sweep"])
def test_a_release_that_cannot_be_installed_gives_no_answer(tmp_path, command):
    """No environment, no verdict: exit 5, that release named as failed with the installer's reason,
    no release named as the change, no cell read as a verdict."""
    _, transformers = _versions()  # the installed release would run here, without an environment
    args = ([*MTP_BISECT, "--releases", f"{UNINSTALLABLE},{transformers}"] if command == "bisect" else
            ["sweep", "--releases", UNINSTALLABLE, "--modes", "step", "--samples", "200"])
    done = subprocess.run([sys.executable, "-m", "lossless_check.faces.cli", *args, "--envs", str(tmp_path / "envs")],
                          cwd=tmp_path, env={**_clean_environ(), "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 5, done.stdout + done.stderr
    failed = f"failed (building the environment of transformers {UNINSTALLABLE} failed: "
    assert (f"{UNINSTALLABLE}: {failed}" if command == "bisect" else f"step {failed}") in done.stderr, done.stderr
    if command == "bisect":
        assert done.stdout.startswith(f"no answer: no verdict at {UNINSTALLABLE}, an end of the range"), done.stdout
        assert "first release" not in done.stdout and "no change" not in done.stdout
    else:
        table = (tmp_path / "compat_table.md").read_text()
        assert f"| generator | {UNINSTALLABLE} |\n|---|---|\n| (no report) | failed |\n" in table
        assert "no verdict from 1 of 1 runs" in done.stdout


def test_a_bisect_from_an_environment_without_torch_gives_no_answer(tmp_path):
    """The harness installed without torch: the release environment built over it fails its check, and
    is reported so, not read as a verdict."""
    _, transformers = _versions()
    python = _virtualenv(tmp_path / "venv", [f"transformers=={transformers}", "numpy", "scipy", "rich", "hypothesis",
                                             "matplotlib", "packaging"], ["--no-deps", "-e", str(ROOT)])
    done = subprocess.run([str(python), "-m", "lossless_check.faces.cli", *MTP_BISECT, "--releases", f"5.16.0,{transformers}",
                           "--envs", str(tmp_path / "envs")],
                          cwd=tmp_path, env=_clean_environ(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 5, done.stdout + done.stderr
    assert "5.16.0: failed (the environment of transformers 5.16.0 is broken: ModuleNotFoundError: No module named " \
           "'torch')" in done.stderr, done.stderr
    assert done.stdout.startswith("no answer: no verdict at 5.16.0, an end of the range"), done.stdout


def test_a_broken_cached_environment_is_rebuilt(tmp_path):
    """An environment that no longer imports is built again before it is used, and says so."""
    from lossless_check.history.release_env import BUILT, env_home, environment

    release = "5.16.0"
    home = env_home(release, tmp_path)
    (home / "bin").mkdir(parents=True)
    (home / BUILT).write_text(release)
    (home / "bin" / "python").write_text("#!/bin/sh\necho 'ImportError: a broken install' >&2\nexit 1\n")
    (home / "bin" / "python").chmod(0o755)
    said = []
    python = environment(release, tmp_path, said.append)
    assert said == [f"{release}: the cached environment {home} is broken (ImportError: a broken install); "
                    "rebuilding it"]
    check = subprocess.run([str(python), "-c", "import torch, transformers; print(transformers.__version__)"],
                           capture_output=True, text=True, env=_clean_environ())
    assert check.stdout.strip() == release, check.stderr
