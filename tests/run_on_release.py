"""Run this test suite against another transformers release.

    python tests/run_on_release.py 4.44.2 [pytest arguments, default: -q -n 2]

The release's environment is the sweep's (built once and cached, :mod:`lossless_check.history.release_env`:
``transformers==RELEASE`` over this environment's packages, so pytest, hypothesis, torch and the rest
come from here); this checkout runs there first on ``PYTHONPATH``. Tests of findings and
behaviour that belong to other releases skip themselves by the installed version. Exits with pytest's
status.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python tests/run_on_release.py RELEASE [pytest arguments]", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from lossless_check.history.release_env import environment

    release, pytest_args = argv[0], argv[1:] or ["-q", "-n", "2"]
    try:
        python = environment(release)
    except RuntimeError as exc:
        print(f"run_on_release: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.call([str(python), "-m", "pytest", *pytest_args], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
