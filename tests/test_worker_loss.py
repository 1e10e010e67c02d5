"""A dead worker loses nothing: the pool is replaced, the lost tasks run again, the report is the uninterrupted
run's (same verdicts, sample counts, p-values) and says a worker was lost; a task that kills its worker every
time is its case's ``error``, and the run goes on (lossless_check/running/worker_loss.py).

The workers die by SIGKILL, as the OOM killer kills (fixtures/kills_its_worker.py).
"""

from __future__ import annotations

import dataclasses
import os
import signal
from concurrent.futures import Future

import pytest

from lossless_check.faces.api import cases_for, run_cases
from lossless_check.running import scheduler
from lossless_check.running.worker_loss import RETRIES, WorkerLost, death_reason

ONCE = "fixtures.kills_its_worker:AssistedKilledOnce"
EVERY_TIME = "fixtures.kills_its_worker:AssistedKilledEveryTime"
WARPERS = ["top_k=3", "temperature=0.6"]
TIMINGS = ("seconds", "samples_per_second")


def rows(result) -> list[dict]:
    return [{k: v for k, v in dataclasses.asdict(c).items() if k not in TIMINGS} for c in result.cases]


def test_a_dead_workers_exit_status_in_words():
    assert death_reason(-signal.SIGKILL) == "worker killed by signal 9 (SIGKILL: out of memory?)"
    assert death_reason(-signal.SIGSEGV) == "worker killed by signal 11 (SIGSEGV)"
    assert death_reason(1) == "worker exited with code 1"


def test_a_lost_task_runs_again_until_its_worker_has_died_too_often():
    """The scheduler alone, on a fake pool: task 0's worker dies every time, task 1 is stopped once with the
    pool (not its fault: it is not counted against it)."""
    attempts: dict[int, int] = {}

    def submit(fn, *args):
        future: Future = Future()
        attempts[args[0]] = attempts.get(args[0], 0) + 1
        if args[0] == 0:
            future.set_exception(WorkerLost("worker killed by signal 9 (SIGKILL: out of memory?)", culprit=True))
        elif attempts[1] == 1:
            future.set_exception(WorkerLost("its pool was replaced after a worker was lost", culprit=False))
        else:
            future.set_result(fn(*args))
        return future

    class Result:
        samples = 0

        def __init__(self, value):
            self.value = value

    losses = []
    results = scheduler.Scheduler(submit, 2).map(Result, [(0,), (1,)], lost=lambda loss: losses.append(loss) or
                                                 Result(f"error: {loss.reason}"))
    assert [r.value for r in results] == ["error: worker killed by signal 9 (SIGKILL: out of memory?) 3 times", 1]
    assert attempts == {0: RETRIES + 1, 1: 2}
    assert [(loss.index, loss.redone) for loss in losses] == [(0, True), (1, True), (0, True), (0, False)]


@pytest.fixture(autouse=True)
def run_pid(monkeypatch):
    """The run's own process, where the killing generators never kill (the workers inherit the variable)."""
    monkeypatch.setenv("LOSSLESS_TEST_RUN_PID", str(os.getpid()))


@pytest.fixture
def marker(tmp_path, monkeypatch):
    path = tmp_path / "killed"
    monkeypatch.setenv("LOSSLESS_TEST_KILL_MARKER", str(path))
    return path


# heavy: two pools start (3-4 s each of imports on an idle core), and three runs of the cases.
@pytest.mark.heavy
def test_a_worker_killed_midway_costs_its_case_a_rerun_not_the_run(marker, capsys):
    cases = cases_for(["AssistedCandidateGenerator", ONCE], WARPERS, None, "step", "iid8")
    killed = run_cases(cases, 3000, 1e-6, 0, workers=2)
    assert marker.exists()  # a worker did die
    uninterrupted = run_cases(cases, 3000, 1e-6, 0, workers=1)  # no pool: nothing dies
    assert rows(killed) == rows(uninterrupted)
    assert {r.verdict for r in killed.cases} == {"lossless"} and not uninterrupted.workers_lost
    died = [loss for loss in killed.workers_lost if "signal 9" in loss["reason"]]
    assert len(died) == 1 and died[0]["redone"] and died[0]["case"].startswith(ONCE), killed.workers_lost
    assert (f"lossless-check: a worker was lost: {died[0]['case']} runs again (worker killed by signal 9 (SIGKILL: out "
            "of memory?))") in capsys.readouterr().err


@pytest.mark.heavy
def test_a_split_cases_chunk_whose_worker_died_is_collected_again(marker, monkeypatch):
    """A case split across the workers: the chunk the dead worker was collecting runs again on the new pool."""
    cases = cases_for([ONCE], WARPERS[:1], None, "step", "iid8")
    monkeypatch.setattr(scheduler, "should_split", lambda *args: True)
    killed = run_cases(cases, 3000, 1e-6, 0, workers=2)
    assert marker.exists()
    assert rows(killed) == rows(run_cases(cases, 3000, 1e-6, 0, workers=1))
    assert [(loss["chunk"] is not None, loss["redone"]) for loss in killed.workers_lost
            if "signal 9" in loss["reason"]] == [(True, True)], killed.workers_lost


@pytest.mark.heavy
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_case_that_kills_its_worker_every_time_is_an_error_and_the_run_goes_on(backend):
    """Locally the scheduler runs it again on a new pool; on Ray, Ray does (``max_retries``)."""
    if backend == "ray":
        pytest.importorskip("ray")  # its workers get this process's sys.path and environment
    cases = cases_for(["AssistedCandidateGenerator", EVERY_TIME], WARPERS[:1], None, "step", "iid8")
    result = run_cases(cases, 3000, 1e-6, 0, workers=2, backend=backend)
    fine, killer = result.cases
    assert fine.verdict == "lossless" and fine.samples == 3000
    assert killer.verdict == "error" and result.exit_code == 1
    lost = "worker killed by signal 9 (SIGKILL: out of memory?)" if backend == "local" else "Ray worker lost ("
    assert killer.reason.startswith(lost) and f"{RETRIES + 1} times" in killer.reason, killer.reason
    assert [loss["redone"] for loss in result.workers_lost if loss["case"] == cases[1].key][-1] is False
