"""Progress of a run on stderr: a rich bar on a terminal, elsewhere (CI logs, pipes) a line at most
every :data:`LINE_INTERVAL` seconds with cases done, trials and an ETA."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

#: Seconds between two progress lines when stderr is not a terminal.
LINE_INTERVAL = 10.0


@contextmanager
def progress_reporter(cases: int | None, quiet: bool = False) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(trials)``, called as each case completes with the trials it ran.

    ``cases`` may be ``None`` when the count is known only once the run starts; the total then
    grows as the caller learns it through ``advance.set_total(cases)``.
    """
    if quiet:
        advance = _Advance(lambda done, total, trials: None)
        yield advance
        return
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("cases"),
                      TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("lossless-check", total=cases)
            advance = _Advance(lambda done, total, trials: bar.update(task, completed=done, total=total), cases)
            yield advance
        return
    started = time.monotonic()
    last = [started]

    def line(done: int, total: int | None, trials: int) -> None:
        now = time.monotonic()
        if now - last[0] < LINE_INTERVAL and done != total:
            return
        last[0] = now
        elapsed = now - started
        eta = f", ETA {elapsed / done * (total - done):.0f} s" if total and done else ""
        of = f"/{total}" if total else ""
        print(f"lossless-check: {done}{of} cases done, {trials} trials, "
              f"{elapsed:.0f} s elapsed{eta}", file=sys.stderr, flush=True)

    yield _Advance(line, cases)


class _Advance:
    """``advance(trials)``: one more case done, after ``trials`` trials."""

    def __init__(self, show: Callable[[int, int | None, int], None], total: int | None = None):
        self.show, self.total, self.done, self.trials = show, total, 0, 0

    def set_total(self, total: int) -> None:
        self.total = total
        self.show(self.done, self.total, self.trials)

    def __call__(self, trials: int) -> None:
        self.done += 1
        self.trials += trials or 0
        self.show(self.done, self.total, self.trials)
