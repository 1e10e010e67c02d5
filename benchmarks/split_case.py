"""One large case split across workers: ``--workers 2`` against ``--workers 1``, side by side.

    python benchmarks/split_case.py [--rounds 1] [--json PATH]

The case is the main job's longest: ``AssistedCandidateGenerator`` on ``zipf32k`` under
``top_p=0.9`` (a 32,000-token vocabulary; lossless, so it runs all 5,000 trials). With one worker
it runs whole in this process; with two, its chunks are collected by both workers while its looks
are taken in the driver (``lossless_check/running/scheduler.py``). Arms alternate; the figure is the ratio
of wall times (benchmarks/README.md), and the two reports must agree, timings aside.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE = ["run", "--generator", "AssistedCandidateGenerator", "--scenario", "zipf32k", "--warpers", "top_p=0.9",
        "--no-verifier", "--quiet"]
TIMINGS = ("seconds", "samples_per_second")


def run(workers: int, report: Path) -> float:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lossless_check.faces.cli", *CASE, "--workers", str(workers),
                           "--json", str(report)], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"--workers {workers} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - started


def cases(report: Path) -> list[dict]:
    return [{k: v for k, v in c.items() if k not in TIMINGS} for c in json.loads(report.read_text())["cases"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    seconds: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="lc-split-") as tmp:
        for round_ in range(args.rounds):
            for workers in (1, 2):
                seconds[workers].append(run(workers, Path(tmp) / f"w{workers}-{round_}.json"))
                print(f"round {round_ + 1}, --workers {workers}: {seconds[workers][-1]:.1f} s", file=sys.stderr,
                      flush=True)
        reports = [cases(Path(tmp) / f"w{w}-{r}.json") for w in (1, 2) for r in range(args.rounds)]
        identical = all(r == reports[0] for r in reports)
        case = reports[0][0]
    ratio = sum(seconds[1]) / sum(seconds[2])
    print(f"| case | --workers 1 (s) | --workers 2 (s) | speed-up |\n|---|---|---|---|\n"
          f"| Assisted, zipf32k, top_p=0.9 ({case['verdict']}, {case['samples']} trials) | "
          f"{sum(seconds[1]) / args.rounds:.1f} | {sum(seconds[2]) / args.rounds:.1f} | {ratio:.2f}x |")
    print(f"identical reports: {identical}")
    doc = {"seconds": seconds, "speedup": ratio, "identical": identical}
    print(json.dumps(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
