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
       "fixtures.mutants.dflash_raw_logits:DFlashReturnsRawLogits", "--scenario", "iid8", "--samples", "800", "--quiet"]
#: What two runs of the same cases may differ in: the time they took.
TIMINGS = ("seconds", "samples_per_second")


def report(tmp_path: Path, name: str, *extra: str) -> list[dict]:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "lossless_check.cli", *RUN, *extra, "--json", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr  # the mutant is not lossless
    return [{k: v for k, v in case.items() if k not in TIMINGS} for case in json.loads(out.read_text())["cases"]]


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


@needs(DFLASH)
def test_a_case_split_across_a_two_node_cluster_gives_the_unsplit_result(monkeypatch):
    """Chunks as Ray tasks on two nodes, looks in the driver: the run of one worker, timings aside."""
    import dataclasses

    from lossless_check import scheduler
    from lossless_check.api import cases_for, run_cases

    cases = cases_for(["DFlashTokenCandidateGenerator", "fixtures.mutants.dflash_raw_logits:DFlashReturnsRawLogits"],
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
