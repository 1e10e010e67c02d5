"""``lc.run(..., workers=2)`` from a script: its worker processes import the script again (spawn), so
calls outside ``if __name__ == "__main__":`` are refused in one line before any worker starts, and
guarded ones are not."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUARD_LINE = 'put the script\'s calls under `if __name__ == "__main__":`'


def run_script(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)


def test_an_unguarded_lc_run_with_workers_fails_in_one_line_before_any_worker_starts(tmp_path):
    done = run_script(tmp_path, """
        import lossless_check as lc
        print("script body ran")
        lc.run(["AssistedCandidateGenerator"], warpers=["top_k=3", "temperature=0.6"], scenario="iid8",
               samples=100, workers=2, verifier=False)
        """)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("lossless_check.core.errors.UsageError: workers=2 starts worker processes") and GUARD_LINE in last
    assert "BrokenProcessPool" not in done.stderr and done.stdout.count("script body ran") == 1  # no worker re-ran it


@pytest.mark.parametrize("source, refused", [
    ("from lossless_check.running.spawn_guard import check_main_guard\ncheck_main_guard(2)\n", True),
    ("from lossless_check.running.spawn_guard import check_main_guard\nif __name__ == '__main__':\n    check_main_guard(2)\n",
     False),
    ("from lossless_check.running.spawn_guard import check_main_guard\ndef main():\n    check_main_guard(2)\nmain()\n", True),
    ("from lossless_check.running.spawn_guard import check_main_guard\ndef main():\n    check_main_guard(2)\n"
     "if __name__ == \"__main__\" and True:\n    main()\n", False),
])
def test_the_guard_is_read_where_the_script_calls(tmp_path, source, refused):
    done = run_script(tmp_path, source)
    assert (done.returncode == 1 and GUARD_LINE in done.stderr) if refused else done.returncode == 0, done.stderr


def test_nothing_is_refused_where_spawn_does_not_import_the_script_again(tmp_path):
    code = "from lossless_check.running.spawn_guard import check_main_guard; check_main_guard(2)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
