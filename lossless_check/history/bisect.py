"""``bisect``: the release where a case's verdict changes, found by running the case in one environment per release.

A release whose run fails gives no verdict (:class:`Failed`), never a guess: bisection then says it has no answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from lossless_check.history.release_env import environment
from lossless_check.history.sweep import run_in


@dataclass(frozen=True)
class Failed:
    """A release that gave no verdict, and why: never equal to a verdict, so never read as one."""

    reason: str

    def __str__(self) -> str:
        return f"failed ({self.reason})"


@dataclass
class Bisection:
    """What :func:`bisect` observed: ``first``, the first release whose verdict differs from the oldest's
    (its predecessor's verdict is the oldest's, both observed), or ``None`` with ``no_answer`` saying why
    no boundary was observed (``None`` and ``""``: both ends agree, no change); ``seen``, every release
    looked at and its verdict or :class:`Failed`."""

    first: str | None
    seen: dict
    no_answer: str = ""


def bisect(verdict_at, releases: list[str]) -> Bisection:
    """The first release whose verdict differs from the oldest's, by binary search (which assumes one
    change). ``verdict_at(release)`` gives a verdict or a :class:`Failed`; a release that failed is
    stepped over (the nearest release to the middle that gives a verdict is looked at instead), and a
    boundary is named only between two adjacent releases whose verdicts were both observed."""
    seen: dict = {}

    def at(index: int):
        if releases[index] not in seen:
            seen[releases[index]] = verdict_at(releases[index])
        return seen[releases[index]]

    for end in (0, len(releases) - 1):  # without both, nothing can be said: the other is not run
        if isinstance(at(end), Failed):
            return Bisection(None, seen, f"no verdict at {releases[end]}, an end of the range")
    ends = [seen[releases[0]], seen[releases[-1]]]
    if ends[0] == ends[1]:
        return Bisection(None, seen)
    low, high = 0, len(releases) - 1  # verdict at low is the oldest's, at high it is not
    while high - low > 1:
        middle = (low + high) // 2
        for index in sorted(range(low + 1, high), key=lambda i: (abs(i - middle), i)):
            if not isinstance(at(index), Failed):
                break
        else:
            return Bisection(None, seen, f"the verdict changes between {releases[low]} and {releases[high]}, "
                                         "and every release between them failed")
        low, high = (index, high) if seen[releases[index]] == ends[0] else (low, index)
    return Bisection(releases[high], seen)


def case_verdict(release: str, args: list[str], work: Path, envs: Path | None = None, timeout: float = 1800,
                 say=print):
    """The verdict of the one case ``args`` names in ``release`` (the verdicts of its cases, joined), or
    :class:`Failed` with the reason; ``say`` gets a line either way."""
    started = time.monotonic()
    try:
        python = environment(release, envs, say)
    except RuntimeError as exc:
        result = Failed(str(exc))
    else:
        work.mkdir(parents=True, exist_ok=True)
        doc = run_in(python, release, args, work / f"bisect-{release}.json", timeout)
        result = Failed(doc["failed"]) if "failed" in doc else ", ".join(sorted({c["verdict"] for c in doc["cases"]}))
    say(f"{release}: {result} ({time.monotonic() - started:.0f} s)")
    return result
