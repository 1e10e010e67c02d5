"""``--transformers X.Y.Z`` on ``run``, ``gate`` and ``models``: the same command, run in that release's environment.

A generator written for another release (it imports what the installed one removed, or relies on a
constructor it changed) is gated on the release it targets: the command runs again, unchanged but for
this option, in the environment ``sweep`` makes for that release
(:func:`lossless_check.history.release_env.environment`: the release's transformers first on the path,
torch, the harness and the user's own packages from here). Its output and exit code are the command's;
the current directory is kept, so ``module:attr`` specs and relative paths mean what they mean here.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from lossless_check.core.errors import UsageError

OPTION = "--transformers"


def release_version(text: str) -> str:
    """A final transformers release the harness supports (``4.37.0`` or later), as argparse's ``type``."""
    from packaging.version import InvalidVersion, Version

    from lossless_check.history.sweep import FIRST_SUPPORTED

    try:
        version = Version(text)
    except InvalidVersion:
        raise argparse.ArgumentTypeError(f"{text!r} is not a release number (e.g. 5.24.0)") from None
    if version.is_prerelease or version < Version(FIRST_SUPPORTED):
        raise argparse.ArgumentTypeError(f"{text!r}: the supported releases are the final ones from {FIRST_SUPPORTED}")
    return text


def add_release_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(OPTION, type=release_version, default=None, metavar="X.Y.Z",
                        help="run this command in transformers X.Y.Z's environment (built once, as sweep builds "
                             "them; default: the installed transformers)")


def without_release_option(argv: list[str]) -> list[str]:
    """``argv`` without ``--transformers X`` / ``--transformers=X``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == OPTION:
            skip = True
        elif not arg.startswith(OPTION + "="):
            out.append(arg)
    return out


def run_on_release(release: str, argv: list[str]) -> int | None:
    """Run ``lossless-check argv`` (without the option) in ``release``'s environment and return its exit code;
    ``None`` when the installed transformers is that release (the command runs here). An environment that
    cannot be built is a one-line :class:`UsageError` (e.g. a release the package index does not serve)."""
    from lossless_check.history.release_env import child_environ, environment

    try:
        python = environment(release, say=lambda line: print(f"lossless-check: {line}", file=sys.stderr))
    except RuntimeError as exc:
        raise UsageError(f"{OPTION} {release}: {exc}") from None
    if python == Path(sys.executable):
        return None
    print(f"lossless-check: running in the environment of transformers {release} ({python})", file=sys.stderr)
    env = child_environ()
    # One command, not one of a sweep's side-by-side releases: the user's own thread setting, if any.
    env.pop("OMP_NUM_THREADS")
    env.update({k: v for k, v in os.environ.items() if k == "OMP_NUM_THREADS"})
    child = subprocess.Popen([str(python), "-m", "lossless_check", *without_release_option(argv)], env=env)
    try:
        return child.wait()
    except KeyboardInterrupt:  # Ctrl-C reached both; a SIGTERM (turned into this) only us: pass it on
        child.send_signal(signal.SIGINT)
        return child.wait()


__all__ = ["add_release_option", "release_version", "run_on_release", "without_release_option"]
