"""What a dead worker costs: one worker of a 2-worker run SIGKILLed about halfway, against the same run
uninterrupted (issue 53's Done-when).

    python benchmarks/worker_killed.py [--fraction 0.5] [--json PATH] [--also "--matrix smoke --scenario iid8"]

The command: ``lossless-check run --generator AssistedCandidateGenerator --matrix default --workers 2`` (the
default Assisted run: its real-vocabulary cases are split over both workers). The uninterrupted run is timed
first (``full``); then the same command runs again and, ``fraction * full`` seconds in, the busiest of its pool
workers gets SIGKILL, as the OOM killer sends it. The figures: both exit codes and wall times, what the killed
run said on stderr and in ``workers_lost``, and whether its report equals the uninterrupted one (every case's
verdict, samples and p-values; timings and ``workers_lost`` aside).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lossless_check.outputs.report import without_timings

COMMAND = ["run", "--generator", "AssistedCandidateGenerator", "--matrix", "default", "--workers", "2", "--quiet",
           "--no-verifier"]


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "lossless_check.faces.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def pool_workers(pid: int) -> list[tuple[int, int]]:
    """``(cpu ticks, pid)`` of the run's pool workers (its spawned children; not multiprocessing's resource tracker)."""
    workers = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in cmdline:
            workers.append((int(fields[11]) + int(fields[12]), int(stat.parent.name)))
    return sorted(workers, reverse=True)


def comparable(report: dict) -> dict:
    return {k: v for k, v in without_timings(report).items() if k != "workers_lost"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--also", default="", help="more arguments for the command")
    args = parser.parse_args()
    command = COMMAND + shlex.split(args.also)
    with tempfile.TemporaryDirectory() as work:
        full_json, killed_json = Path(work) / "full.json", Path(work) / "killed.json"
        started = time.perf_counter()
        full = start(command + ["--json", str(full_json)])
        full.communicate()
        full_seconds = time.perf_counter() - started

        started = time.perf_counter()
        killed = start(command + ["--json", str(killed_json)])
        time.sleep(args.fraction * full_seconds)
        workers = pool_workers(killed.pid)
        assert workers and killed.poll() is None, "the run ended, or has no pool, before the kill"
        os.kill(workers[0][1], signal.SIGKILL)
        killed_at = time.perf_counter() - started
        killed_err = killed.communicate()[1]
        killed_seconds = time.perf_counter() - started

        uninterrupted, after_kill = json.loads(full_json.read_text()), json.loads(killed_json.read_text())
        def rows(doc: dict) -> list[tuple]:
            return [(c["verdict"], c["samples"], c["p_value"], c.get("p_value_adjusted")) for c in doc["cases"]]

        figures = {
            "command": "lossless-check " + " ".join(command), "cases": len(uninterrupted["cases"]),
            "full": {"exit": full.returncode, "seconds": round(full_seconds, 1)},
            "killed": {"exit": killed.returncode, "seconds": round(killed_seconds, 1),
                       "sigkill_at_seconds": round(killed_at, 1), "worker_pid": workers[0][1]},
            "verdicts": {v: [r[0] for r in rows(uninterrupted)].count(v) for v in sorted({r[0] for r in
                                                                                        rows(uninterrupted)})},
            "same_verdicts_samples_p_values": rows(uninterrupted) == rows(after_kill),
            "same_report_timings_aside": comparable(uninterrupted) == comparable(after_kill),
            "workers_lost": after_kill["workers_lost"],
            "stderr_lost_lines": [line for line in killed_err.splitlines() if "a worker was lost" in line],
        }
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["same_report_timings_aside"] and figures["workers_lost"] else 1


if __name__ == "__main__":
    sys.exit(main())
