"""What a kill costs: a run killed about halfway, then ``--resume``, against the same run uninterrupted.

    python benchmarks/resume_after_kill.py [--command run|gate] [--signals TERM,KILL] [--fraction 0.5] [--json PATH]
                                           [--also "--matrix smoke --scenario iid8"]

``run``: ``lossless-check run --generator AssistedCandidateGenerator --matrix default --workers 2``
(48 cases; the two real-vocabulary cases, zipf32k and lm49k, start first and are split over both
workers). ``gate``: ``lossless-check gate --generator AssistedCandidateGenerator --workers 2`` (step and
generate mode over the default matrix). The uninterrupted run is timed first (``full``); then, per
signal, the same command is killed after ``fraction * full`` seconds (``before``: SIGTERM to the run, or
SIGKILL to the run's process alone, as an OOM killer sends it) and resumed (``resume``). The figures:
the resumed wall time against the Done-when bound ``full - 0.6 * before``, the work kept
(``saved = full - resume``, as a share of ``before``), and the check that the resumed report equals
the uninterrupted one, timings aside. Timings are wall times side by side on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lossless_check.outputs.report import without_timings  # noqa: E402

COMMANDS = {
    "run": ["run", "--generator", "AssistedCandidateGenerator", "--matrix", "default", "--workers", "2", "--quiet",
            "--no-verifier"],
    "gate": ["gate", "--generator", "AssistedCandidateGenerator", "--workers", "2", "--quiet", "--no-verifier"],
}


def start(args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "lossless_check.faces.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def timed(args: list[str]) -> tuple[float, int, str]:
    started = time.perf_counter()
    process = start(args)
    _, err = process.communicate()
    return time.perf_counter() - started, process.returncode, err


def report_of(command: str, where: Path) -> dict:
    path = where / "report.json" if command == "gate" else where
    return without_timings(json.loads(path.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", choices=tuple(COMMANDS), default="run")
    parser.add_argument("--signals", default="TERM,KILL")
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--also", default="", help="arguments added to the command (a smaller matrix)")
    options = parser.parse_args()
    base = COMMANDS[options.command] + options.also.split()
    flag = "--out" if options.command == "gate" else "--json"
    figures = {"command": "lossless-check " + " ".join(base)}
    with tempfile.TemporaryDirectory() as folder:
        fresh = Path(folder) / ("fresh" if options.command == "gate" else "fresh.json")
        full, code, err = timed([*base, flag, str(fresh)])
        figures["full_s"], figures["exit"] = round(full, 1), code
        print(f"uninterrupted: {full:.1f} s, exit {code}", flush=True)
        expected = report_of(options.command, fresh)
        for name in options.signals.split(","):
            how = getattr(signal, f"SIG{name}")
            where = Path(folder) / (name if options.command == "gate" else f"{name}.json")
            running = start([*base, flag, str(where)])
            before = options.fraction * full
            time.sleep(before)
            running.send_signal(how)
            running.communicate()
            resume, resumed_code, err = timed([*base, flag, str(where), "--resume"])
            kept = next((line for line in err.splitlines() if "resuming:" in line), "")
            same = report_of(options.command, where) == expected and resumed_code == code
            bound = full - 0.6 * before
            figures[name] = {"before_s": round(before, 1), "resume_s": round(resume, 1), "bound_s": round(bound, 1),
                             "within_bound": resume <= bound, "saved_share_of_before": round((full - resume) / before, 2),
                             "same_report": same, "kept": kept.split("resuming: ")[-1]}
            print(f"SIG{name} at {before:.1f} s: resume {resume:.1f} s (bound {bound:.1f} s), "
                  f"{kept.split('resuming: ')[-1]}; report equal to the uninterrupted one: {same}", flush=True)
    if options.json:
        Path(options.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
