"""A worker lost mid-task (the OOM killer, a segfault, SIGKILL) costs the tasks it was running, never the run.

The local pool (:class:`~lossless_check.running.engine.Engine`) breaks as a whole when one of its processes
dies: every task on it fails with ``BrokenProcessPool``. A :class:`PoolWatch` says which task the dead process
was running (each worker writes the id of its task on a shared-memory :class:`board <PoolWatch>` as it starts
it), and turns each failure into :class:`WorkerLost`: ``culprit`` for the task whose worker died, not for the
tasks stopped with the pool. The :class:`~lossless_check.running.scheduler.Scheduler` runs every lost task
again on a new pool (a chunk's or a case's trials are functions of their seeds alone: the report is the one
an uninterrupted run writes), and a task whose worker died more than :data:`RETRIES` times is not run again:
its case is an ``error`` saying why, and the run goes on. On Ray, Ray itself runs a task again
(``max_retries``); its last failure is turned into :class:`WorkerLost` too
(:mod:`lossless_check.running.ray_backend`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from typing import Callable

#: Times a task runs again after the worker running it died; one more death makes it its case's ``error``.
RETRIES = 2
#: Seconds a broken pool's dead process may take to report its exit status (its pipes close just before).
EXIT_STATUS_SECONDS = 2.0


class WorkerLost(Exception):
    """A task did not finish because a worker died: its own (``culprit``) or another of its pool's.
    ``final``: it will not run again (Ray already ran it :data:`RETRIES` more times)."""

    def __init__(self, reason: str, culprit: bool, final: bool = False):
        super().__init__(reason)
        self.reason, self.culprit, self.final = reason, culprit, final


@dataclass
class WorkerLoss:
    """One task a lost worker cost, as the report lists it: task ``index`` of the run's map (its case), the
    ``chunk`` of a split case (``None``: the whole case), why, and whether it was ``redone``."""

    index: int
    chunk: int | None
    reason: str
    redone: bool

    def to_dict(self) -> dict:
        return asdict(self)


def death_reason(exitcode: int) -> str:
    """A dead worker's exit status in words."""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "an unknown signal"
        hint = ": out of memory?" if -exitcode == signal.SIGKILL else ""
        return f"worker killed by signal {-exitcode} ({name}{hint})"
    return f"worker exited with code {exitcode}"


_SLOT: dict = {}


def join_board(board, initializer, initargs: tuple) -> None:
    """A pool worker's initializer: take a slot of ``board`` (its pid), then ``initializer(*initargs)``."""
    slots, taken = board
    with taken.get_lock():
        slot = taken.value
        taken.value += 1
    if 2 * slot < len(slots):
        slots[2 * slot] = os.getpid()
        _SLOT["board"], _SLOT["index"] = slots, 2 * slot + 1
    initializer(*initargs)


def on_board(task_id: int, task, *args):
    """``task(*args)`` in a pool worker, its ``task_id`` on the board while it runs."""
    slots, index = _SLOT.get("board"), _SLOT.get("index")
    if slots is not None:
        slots[index] = task_id
    try:
        return task(*args)
    finally:
        if slots is not None:
            slots[index] = 0


def translated(inner: Future, translate: Callable[[BaseException], BaseException]) -> Future:
    """``inner``'s outcome, its exception replaced by ``translate(exception)`` (as it completes, in the thread
    that completes it)."""
    outer: Future = Future()

    def done(future: Future) -> None:
        if future.cancelled():
            outer.cancel()
        elif future.exception() is not None:
            outer.set_exception(translate(future.exception()))
        else:
            outer.set_result(future.result())

    inner.add_done_callback(done)
    return outer


class PoolWatch:
    """One pool's board and, once the pool breaks, which tasks its dead processes were running and why."""

    def __init__(self, context, workers: int):
        self.board = (context.RawArray("q", 2 * workers), context.Value("i", 0))
        self.pool = None
        self.broken = False
        self._dead: dict[int, str] | None = None
        self._lock = threading.Lock()

    def track(self, inner: Future, task_id: int) -> Future:
        """The future of task ``task_id`` (submitted as :func:`on_board`), with a ``BrokenProcessPool`` turned into
        :class:`WorkerLost`."""

        def lost(error: BaseException) -> BaseException:
            if not isinstance(error, BrokenProcessPool):
                return error
            reason = self._culprits().get(task_id)
            return WorkerLost(reason or "its pool was replaced after a worker was lost", reason is not None)

        return translated(inner, lost)

    def attributed(self) -> bool:
        """Whether the pool broke because a worker died running a task (not, say, in its initializer)."""
        return bool(self._culprits())

    def _culprits(self) -> dict[int, str]:
        """``{task id: why its worker died}``. Read at the first failure: the pool's own clean-up terminates
        its other processes right after it fails its futures."""
        with self._lock:
            if self._dead is None:
                self.broken = True
                slots = self.board[0]
                running = {slots[i]: slots[i + 1] for i in range(0, len(slots), 2) if slots[i + 1]}
                self._dead = {running[pid]: death_reason(code) for pid, code in self._exit_codes().items()
                              if pid in running}
            return self._dead

    def _exit_codes(self) -> dict[int, int]:
        processes = dict(getattr(self.pool, "_processes", None) or {})
        deadline = time.monotonic() + EXIT_STATUS_SECONDS
        while True:
            dead = {pid: p.exitcode for pid, p in processes.items() if p.exitcode is not None}
            if dead or time.monotonic() > deadline:
                return dead
            time.sleep(0.01)
