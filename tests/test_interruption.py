"""Long runs lose nothing: paths checked before any work, finished cases kept, ``--resume``.

The CLI runs in a subprocess, as a CI job would; SIGTERM is what a CI time-out or a pre-empted node sends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.releases import DFLASH, needs
from lossless_check.outputs.report import TIMING_FIELDS
from lossless_check.outputs.report import without_timings as cases_without_timings

ROOT = Path(__file__).resolve().parents[1]
HANGS = "fixtures.mutants.hangs_when_told:DFlashHangsWhenTold"
#: Two quick cases, then one that hangs while LOSSLESS_TEST_HANG is set (600 trials: a pass with power 0.99 at TV 0.3).
ARGS = ["run", "--generator", "DFlashTokenCandidateGenerator", "--generator", HANGS, "--warpers", "top_k=3",
        "--warpers", "temperature=0.6", "--scenario", "iid8", "--samples", "600", "--quiet", "--table", "full",
        "--no-verifier"]
#: What differs between two runs of the same cases besides the results: the time they took.
TIMINGS = TIMING_FIELDS


def lossless_check(*args: str, hang: bool = False, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("LOSSLESS_TEST_HANG", None)
    if hang:
        env["LOSSLESS_TEST_HANG"] = "1"
    return subprocess.Popen([sys.executable, "-m", "lossless_check.faces.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out + err


def without_timings(report: dict) -> dict:
    """``report`` with its cases' timings left out (:func:`~lossless_check.outputs.report.without_timings`)."""
    return {**report, "cases": cases_without_timings(report["cases"])}


def test_an_unwritable_report_path_fails_at_once(tmp_path):
    (tmp_path / "a-file").write_text("")
    # A missing parent directory is made, not refused (tests/test_cli.py); an unwritable one is refused.
    for args in (["run", "--json", "/proc/lossless/dir/x.json"], ["run", "--json", str(tmp_path)],
                 ["run", "--json", str(tmp_path / "a-file" / "deeper" / "x.json")],
                 ["verifier", "--json", "/proc/lossless/v.json"],
                 ["fuzz", "--generator", "AssistedCandidateGenerator", "--database", "/proc/lossless-fuzz"],
                 ["fuzz", "--generator", "AssistedCandidateGenerator", "--json", "/proc/lossless/f.json"],
                 ["gate", "--generator", "AssistedCandidateGenerator", "--out", "/proc/lossless-gate"],
                 ["gate", "--generator", "AssistedCandidateGenerator", "--out", str(tmp_path / "a-file" / "gate")],
                 ["run", "--repro", "/proc/repros"], ["run", "--resume", "--warpers", "top_k=3"],
                 ["fuzz", "--generator", "AssistedCandidateGenerator", "--database", "/proc/fuzz"]):
        started = time.perf_counter()
        code, output = finish(lossless_check(*args))
        assert code == 2 and time.perf_counter() - started < 2, (args, output)
        assert len(output.strip().splitlines()) == 1 and output.startswith("lossless-check: error: "), output


def test_a_module_attr_that_is_no_generator_is_a_usage_error():
    code, output = finish(lossless_check("run", "--generator", "os:getcwd", "--warpers", "top_k=3"))
    assert code == 2 and "neither a candidate generator class nor a factory" in output, output
    assert len(output.strip().splitlines()) == 1


@needs(DFLASH)
def test_sigterm_keeps_the_finished_cases_and_resume_gives_the_uninterrupted_report(tmp_path):
    report = tmp_path / "r.json"
    journal = tmp_path / "r.json.journal.jsonl"
    running = lossless_check(*ARGS, "--json", str(report), hang=True)
    deadline = time.monotonic() + 300
    while not (journal.exists() and len(journal.read_text().splitlines()) >= 3):  # header + two cases
        assert running.poll() is None and time.monotonic() < deadline, finish(running)
        time.sleep(0.2)
    running.send_signal(signal.SIGTERM)
    code, output = finish(running, timeout=60)
    assert code == 4 and "--resume" in output, output
    partial = json.loads(report.read_text())
    assert partial["interrupted"] is True
    assert [c["verdict"] for c in partial["cases"]][:2] == ["lossless", "lossless"]
    assert {c["verdict"] for c in partial["cases"][2:]} == {"unfinished"}

    code, output = finish(lossless_check(*ARGS, "--json", str(report), "--resume"))
    assert code == 0, output
    resumed = json.loads(report.read_text())
    fresh = tmp_path / "fresh.json"
    assert finish(lossless_check(*ARGS, "--json", str(fresh)))[0] == 0
    assert without_timings(resumed) == without_timings(json.loads(fresh.read_text()))


def test_resume_refuses_another_runs_journal(tmp_path):
    report = tmp_path / "r.json"
    args = ["run", "--generator", "DFlashTokenCandidateGenerator", "--warpers", "top_k=3", "--scenario", "iid8",
            "--samples", "600", "--quiet", "--no-verifier", "--json", str(report)]
    assert finish(lossless_check(*args))[0] == 0
    code, output = finish(lossless_check(*args, "--seed", "1", "--resume"))
    assert code == 2 and "another run's" in output, output


#: The uninterrupted reports the killed-and-resumed runs are compared with, made once per arguments.
_FRESH: dict[tuple, dict] = {}


def fresh_report(tmp_path: Path, args: list[str], report_option: str, report_name: str) -> tuple[int, dict]:
    if tuple(args) not in _FRESH:
        where = tmp_path / "fresh"
        code, output = finish(lossless_check(*args, report_option, str(where if report_option == "--out" else
                                                                        where.with_suffix(".json"))))
        path = where / report_name if report_option == "--out" else where.with_suffix(".json")
        _FRESH[tuple(args)] = code, without_timings(json.loads(path.read_text()))
    return _FRESH[tuple(args)]


def kill(running: subprocess.Popen, how: signal.Signals) -> tuple[int, str]:
    """SIGTERM as a CI time-out sends it; SIGKILL to the run's process alone, as an OOM killer does: its
    workers must then stop by themselves."""
    running.send_signal(how)
    code, output = finish(running, timeout=60)
    deadline = time.monotonic() + 30
    while True:  # every process the run started is gone
        try:
            os.killpg(running.pid, 0)
        except ProcessLookupError:
            return code, output
        assert time.monotonic() < deadline, "a worker outlived its killed run"
        time.sleep(0.2)


def kept_chunks(directory: Path) -> int:
    return len(list(directory.glob("*.pkl"))) if directory.is_dir() else 0


# heavy (.ci/run's first step; issue 41): three runs of 48,000 trials each (55-72 s in the suite).
@pytest.mark.heavy
@needs(DFLASH)
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_split_case_killed_midway_resumes_from_its_finished_chunks(tmp_path, how):
    """A case split across two workers (lossless_check/running/scheduler.py), killed about halfway through its
    chunks: the finished case beside it and the split case's finished chunks are kept, and the resumed
    run ends with the uninterrupted report."""
    # The mutant first: of two cases of equal estimate the first runs whole (two cases, two workers),
    # and stops within a few hundred trials; the second, lossless, splits (one case left, two workers).
    args = ["run", "--generator", "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits", "--generator",
            "DFlashTokenCandidateGenerator", "--warpers", "top_k=3", "--scenario", "iid8", "--samples", "48000",
            "--workers", "2", "--quiet", "--no-verifier", "--table", "full"]
    report, journal = tmp_path / "r.json", tmp_path / "r.json.journal.jsonl"
    chunks = tmp_path / "r.json.journal.chunks"
    running = lossless_check(*args, "--json", str(report), start_new_session=True)
    deadline = time.monotonic() + 300
    # The split case has 51 chunks (lossless_check.running.chunks.chunk_sizes): stop it with about half done.
    while not (journal.exists() and len(journal.read_text().splitlines()) >= 2 and kept_chunks(chunks) >= 25):
        assert running.poll() is None and time.monotonic() < deadline, finish(running)
        time.sleep(0.1)
    code, output = kill(running, how)
    if how == signal.SIGTERM:
        assert code == 4 and "--resume" in output, output
        assert [c["verdict"] for c in json.loads(report.read_text())["cases"]] == ["not_lossless", "unfinished"]
    kept = kept_chunks(chunks)
    assert 25 <= kept < 51
    code, output = finish(lossless_check(*args, "--json", str(report), "--resume"))
    assert code == 1 and f"resuming: 1 of 2 cases finished, {kept} finished chunks of the others kept" in output, output
    assert without_timings(json.loads(report.read_text())) == fresh_report(tmp_path, args, "--json", "")[1]
    assert not chunks.exists()  # a finished run keeps its report and journal, not its chunks


def test_a_resumed_case_collects_only_the_chunks_not_kept_and_ends_as_an_uninterrupted_one(tmp_path, monkeypatch):
    """The unit kept is the chunk: a case whose first chunks are kept collects only the others, and its
    result (every field, timings aside) is the uninterrupted one's, sequential e-values included."""
    import dataclasses

    from lossless_check.faces.api import cases_for, run_cases
    from lossless_check.running.chunks import chunk_sizes
    from lossless_check.running.journal import ChunkStore
    from lossless_check.modes import step

    cases = cases_for(["AssistedCandidateGenerator"], ["top_k=3", "temperature=0.6"], None, "step", "iid8")
    samples = 3000

    def rows(run):
        return [{k: v for k, v in dataclasses.asdict(c).items() if k not in TIMINGS} for c in run.cases]

    fresh = rows(run_cases(cases, samples, 1e-6, 0))
    store = ChunkStore(tmp_path / "chunks")
    assert rows(run_cases(cases, samples, 1e-6, 0, chunks=store)) == fresh
    chunks = len(chunk_sizes(samples))
    assert all(store.kept(c.key, None) == list(range(chunks)) for c in cases)
    # A run killed with chunks 0-2 of the first case and 0-3 of the second finished.
    for case, done in zip(cases, (3, 4)):
        for chunk in range(done, chunks):
            store._path(case.key, None, chunk).unlink()
    collected = []
    real = step.StepCase.collect
    monkeypatch.setattr(step.StepCase, "collect",
                        lambda self, n, s, r=None, f=0: collected.append((self.case.key, n)) or real(self, n, s, r, f))
    assert rows(run_cases(cases, samples, 1e-6, 0, chunks=store)) == fresh
    sizes = chunk_sizes(samples)
    assert collected == [(cases[0].key, n) for n in sizes[3:]] + [(cases[1].key, n) for n in sizes[4:]]


def test_a_kept_chunk_is_read_back_only_under_the_facts_it_was_collected_under(tmp_path):
    from lossless_check.running.journal import ChunkStore

    store = ChunkStore(tmp_path / "chunks")
    store.save("case", None, 0, [1, 2, 3], {"order": [1, 0]})
    assert store.load("case", None, 0) == ([1, 2, 3], {"order": [1, 0]})
    assert store.load("case", "batch 1: why", 0) is None and store.load("other", None, 0) is None
    (tmp_path / "chunks" / store._path("case", None, 1).name).write_bytes(b"\x80\x05half a pick")  # killed mid-write
    assert store.load("case", None, 1) is None and store.kept("case", None) == [0, 1]
    store.discard("case")
    assert store.count() == 0


# heavy (.ci/run's first step; issue 41): three gates each (46-75 s in the suite).
@pytest.mark.heavy
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_gate_with_generate_mode_cases_killed_midway_resumes_to_the_uninterrupted_report(tmp_path, how):
    args = ["gate", "--generator", "AssistedCandidateGenerator", "--matrix", "smoke", "--scenario", "iid8",
            "--samples", "2000", "--generate-samples", "400", "--workers", "2", "--quiet", "--no-verifier"]
    out = tmp_path / "gate"
    running = lossless_check(*args, "--out", str(out), start_new_session=True)
    deadline = time.monotonic() + 300
    journal, chunks = out / "journal.jsonl", out / "journal.chunks"
    # The generate-mode cases start first (longest first; the options row is quick); stop with one of them
    # finished, others midway.
    while not (journal.exists() and len(journal.read_text().splitlines()) >= 3 and kept_chunks(chunks) >= 1
               and '"mode": "generate"' in journal.read_text()):
        assert running.poll() is None and time.monotonic() < deadline, finish(running)
        time.sleep(0.1)
    code, output = kill(running, how)
    assert code == (4 if how == signal.SIGTERM else -signal.SIGKILL), output
    finished = len(journal.read_text().splitlines()) - 1
    assert any('"mode": "generate"' in line for line in journal.read_text().splitlines()[1:])
    code, output = finish(lossless_check(*args, "--out", str(out), "--resume"))
    expected = fresh_report(tmp_path, args, "--out", "report.json")
    cases = len(expected[1]["cases"])  # the smoke matrix in step and generate mode, and the greedy row
    assert code == 0 and f"resuming: {finished} of {cases} cases finished" in output, output
    assert (code, without_timings(json.loads((out / "report.json").read_text()))) == expected


# heavy (.ci/run's first step; issue 41): three fuzz searches (58 s in the suite).
@pytest.mark.heavy
def test_a_fuzz_search_killed_midway_resumes_to_the_uninterrupted_result(tmp_path):
    """SIGKILL with some stacks checked: ``fuzz --resume`` checks only the others (each statistical test at
    the alpha the uninterrupted search gave it) and ends with the uninterrupted search's JSON."""
    args = ["fuzz", "--generator", "AssistedCandidateGenerator", "--examples", "8", "--samples", "1000", "--scenario",
            "iid8", "--quiet"]

    def result(path: Path) -> dict:
        strip = lambda v: ({k: strip(x) for k, x in v.items() if k not in TIMINGS} if isinstance(v, dict)  # noqa: E731
                           else [strip(x) for x in v] if isinstance(v, list) else v)
        return strip(json.loads(path.read_text()))

    database = tmp_path / "db"
    running = lossless_check(*args, "--database", str(database), "--json", str(tmp_path / "killed.json"),
                             start_new_session=True)
    deadline = time.monotonic() + 300
    while not (list(database.glob("journal-*.jsonl"))
               and len(next(database.glob("journal-*.jsonl")).read_text().splitlines()) >= 16):
        assert running.poll() is None and time.monotonic() < deadline, finish(running)
        time.sleep(0.1)
    kill(running, signal.SIGKILL)
    code, output = finish(lossless_check(*args, "--database", str(database), "--json", str(tmp_path / "r.json"),
                                         "--resume"))
    assert code == 0 and "resuming: " in output, output
    assert finish(lossless_check(*args, "--database", str(tmp_path / "fresh-db"), "--json",
                                 str(tmp_path / "fresh.json")))[0] == 0
    assert result(tmp_path / "r.json") == result(tmp_path / "fresh.json")


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (22 s on 2 cores).
@pytest.mark.heavy
def test_a_sweep_resumed_continues_a_release_run_that_was_killed(tmp_path, monkeypatch):
    """``sweep --resume``: a release's run killed midway (SIGKILL) goes on from its journal and chunks
    (``run --resume``), and its report is the uninterrupted run's."""
    import transformers

    from lossless_check.history import sweep as history

    release = transformers.__version__  # the installed release runs in this interpreter: no environment to build
    args = ["run", "--generator", "AssistedCandidateGenerator", "--warpers", "top_k=3", "--warpers", "temperature=0.6",
            "--scenario", "iid8", "--samples", "3000", "--seed", "0", "--no-verifier"]
    work = tmp_path / "work"
    work.mkdir()
    report = work / f"{release}-step.json"
    journal = Path(f"{report}.journal.jsonl")
    running = lossless_check(*args, "--json", str(report), start_new_session=True)
    deadline = time.monotonic() + 300
    while not (journal.exists() and len(journal.read_text().splitlines()) >= 2):
        assert running.poll() is None and time.monotonic() < deadline, finish(running)
        time.sleep(0.05)
    kill(running, signal.SIGKILL)
    ran = []
    real = history.run_in
    monkeypatch.setattr(history, "run_in", lambda python, release, args, *rest: ran.append(args) or real(
        python, release, args, *rest))
    results = history.sweep([release], ["step"], {"step": args}, work, say=lambda line: None, resume=True)
    assert ran == [args + ["--resume"]]
    code, _ = finish(lossless_check(*args, "--json", str(tmp_path / "fresh.json")))
    assert without_timings(results[release]["step"]) == without_timings(json.loads((tmp_path / "fresh.json").read_text()))
