"""``--backend ray``: the same JSON as the local pool, on a two-node Ray cluster started on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from fixtures.releases import DFLASH, needs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN = ["run", "--matrix", "smoke", "--generator", "DFlashTokenCandidateGenerator", "--generator",
       "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits", "--scenario", "iid8", "--samples", "800",
       "--quiet"]
#: What two runs of the same cases may differ in: the time they took.
TIMINGS = ("seconds", "samples_per_second")


def report(tmp_path: Path, name: str, *extra: str) -> list[dict]:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "lossless_check.faces.cli", *RUN, *extra, "--json", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr  # the mutant is not lossless
    return [{k: v for k, v in case.items() if k not in TIMINGS} for case in json.loads(out.read_text())["cases"]]


# heavy (.ci/run's first step; issue 41): a two-node cluster and a local run (61 s in the suite).
@pytest.mark.heavy
@needs(DFLASH)
def test_a_two_node_cluster_gives_the_local_pools_report(tmp_path):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        on_ray = report(tmp_path, "ray", "--backend", "ray", "--address", cluster.address)
    finally:
        cluster.shutdown()
    local = report(tmp_path, "local", "--workers", "2")
    assert on_ray == local
    assert {c["verdict"] for c in local} == {"lossless", "not_lossless"}


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (23 s on 2 cores).
@needs(DFLASH)
@pytest.mark.heavy
def test_a_case_split_across_a_two_node_cluster_gives_the_unsplit_result(monkeypatch):
    """Chunks as Ray tasks on two nodes, looks in the driver: the run of one worker, timings aside."""
    import dataclasses

    from lossless_check.running import scheduler
    from lossless_check.faces.api import cases_for, run_cases

    cases = cases_for(["DFlashTokenCandidateGenerator",
                       "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits"],
                      ["top_k=3"], None, "step", "iid8")
    rows = lambda run: [{k: v for k, v in dataclasses.asdict(c).items() if k not in TIMINGS}  # noqa: E731
                        for c in run.cases]
    whole = rows(run_cases(cases, 1500, 1e-6, 0, workers=1))
    monkeypatch.setattr(scheduler, "should_split", lambda *args: True)
    monkeypatch.syspath_prepend(str(ROOT))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        split = rows(run_cases(cases, 1500, 1e-6, 0, backend="ray", address=cluster.address))
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert split == whole and [r["verdict"] for r in whole] == ["lossless", "not_lossless"]


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (28 s on 2 cores).
@pytest.mark.heavy
def test_a_node_lost_mid_run_costs_a_retry_of_its_chunk_not_of_the_case(tmp_path, monkeypatch):
    """Two nodes; the one that is not the head is killed with the case about a third done, as it starts
    a batched call: Ray retries the chunk it was collecting, the rest of the case is not collected again,
    and the result is the uninterrupted one's. Work is counted in rows drafted (fixtures/counting.py)."""
    import dataclasses
    import threading
    import time

    from lossless_check import modes
    from lossless_check.faces.api import cases_for, run_cases
    from lossless_check.modes.replay import replays_per_chunk
    from lossless_check.running.chunks import chunk_sizes

    samples = 8000  # 11 chunks
    cases = cases_for(["fixtures.counting:CountingAssisted"], ["top_k=3"], None, "step", "iid8")
    rows = lambda run: [{k: v for k, v in dataclasses.asdict(c).items() if k not in TIMINGS}  # noqa: E731
                        for c in run.cases]
    calls = lambda path: [tuple(map(int, line.split()))  # noqa: E731 - (rows, process) of each call
                          for line in path.read_text().splitlines()] if path.exists() else []
    counted = lambda path: sum(rows for rows, _ in calls(path))  # noqa: E731
    monkeypatch.syspath_prepend(str(ROOT))
    # Each run probes the generator once, in this process, as a fresh run does (the probe is kept per
    # process: without this the second run drafts one row fewer).
    monkeypatch.setattr(modes, "_PROBED", {})
    monkeypatch.setenv("LOSSLESS_TEST_COUNT", str(tmp_path / "whole"))
    whole = rows(run_cases(cases, samples, 1e-6, 0))
    modes._PROBED.clear()
    work = counted(tmp_path / "whole")
    one_chunk = max(size + replays for size, replays in zip(chunk_sizes(samples), replays_per_chunk(samples)))

    monkeypatch.setenv("LOSSLESS_TEST_COUNT", str(tmp_path / "ray"))  # before the nodes start: their workers inherit it
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4}})
    outcome: dict = {}
    try:
        node = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        raylet = node.all_processes["raylet"][0].process.pid  # the parent of the node's workers
        on_node = lambda pid: Path(f"/proc/{pid}/stat").exists() and int(  # noqa: E731
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == raylet
        thread = threading.Thread(target=lambda: outcome.update(
            run=run_cases(cases, samples, 1e-6, 0, backend="ray", address=cluster.address)))
        thread.start()
        deadline = time.monotonic() + 300
        while counted(tmp_path / "ray") < work / 3:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        # Then at the node's next batched call (the chunk has its replays and verification to go):
        # a kill between two chunks would cost nothing and test nothing.
        seen = len(calls(tmp_path / "ray"))
        while not any(rows > 1 and on_node(pid) for rows, pid in calls(tmp_path / "ray")[seen:]):
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.005)
        cluster.remove_node(node, allow_graceful=False)
        thread.join(timeout=600)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert rows(outcome["run"]) == whole and whole[0]["verdict"] == "lossless"
    extra = counted(tmp_path / "ray") - work
    print(f"rows drafted: {work} uninterrupted, {extra} more with a node lost; one chunk {one_chunk}")
    assert 0 < extra <= one_chunk < work / 5
