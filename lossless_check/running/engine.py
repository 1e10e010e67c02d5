"""The engine shared by every mode: the pool of worker processes (or Ray) that runs a run's cases.

A case runs as one task, or, where it pays, split: its chunks (:mod:`lossless_check.running.chunks`)
are tasks of their own and its looks are taken in this process (:mod:`lossless_check.running.scheduler`).
The pool is started once per run and every mode's cases share it; a pool that loses a worker is replaced,
and the tasks it was running run again (:mod:`lossless_check.running.worker_loss`).
"""

from __future__ import annotations

import itertools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

from lossless_check.running.code_coverage import active_session, start_worker
from lossless_check.running.worker_loss import RETRIES, PoolWatch, join_board, on_board
from lossless_check.running.workers import init_worker, one_thread


def make_engine(workers: int = 1, backend: str = "local", address: str | None = None):
    """The run's engine: the local pool (:class:`Engine`), or Ray (:mod:`lossless_check.running.ray_backend`)."""
    if backend == "ray":
        from lossless_check.running.ray_backend import RayEngine

        return RayEngine(workers, address)
    return Engine(workers)


class Engine:
    """Where a run's tasks execute: this process, or a pool of worker processes started once."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._watch: PoolWatch | None = None
        self._task_ids = itertools.count(1)
        #: Pools that broke with no task to blame (a worker that died starting up, or idle).
        self._unexplained = 0
        self._abandoned: list = []

    def map(self, task: Callable, arguments: list[tuple], progress: Callable[[int], None] | None = None,
            cost: list[float] | None = None, finished: Callable[[int, object], None] | None = None,
            split: Callable | None = None, lost: Callable | None = None) -> list:
        """``[task(*a) for a in arguments]``, on the pool when there is one and it has work for more
        than one worker.

        ``progress(trials)`` is called as each task completes, with its result's ``samples``, and
        ``finished(index, result)`` too (a journal keeps it). ``cost`` (an estimate per task, in
        seconds of one core) orders the queue, longest first, so that a long task does not start last
        and run alone; ``split(*a)`` gives a task as chunks and looks (or ``None``), so that a case
        that would keep workers idle is split across them (:mod:`lossless_check.running.scheduler`). Results
        come back in the order of ``arguments``, and are the same either way. A task whose worker dies runs
        again; ``lost(loss)`` hears of each (:meth:`~lossless_check.running.scheduler.Scheduler.map`).
        """
        from lossless_check.running.scheduler import Scheduler, worth_a_pool

        if self.workers <= 1 or not worth_a_pool(arguments, cost, split, self.workers):
            with one_thread():
                results = []
                for index, args in enumerate(arguments):
                    results.append(task(*args))
                    _report(index, results[-1], progress, finished)
            return results
        scheduler = Scheduler(self._submit, self.workers)
        try:
            with one_thread():  # a split case's looks run here, as they would in a worker
                return scheduler.map(task, arguments, progress, cost, finished, split, lost)
        finally:
            self._abandoned += scheduler.abandoned

    def start_early(self, tasks: int, warm: Callable[[], None]) -> None:
        """Start the workers now, each running ``warm`` (its imports), when ``tasks`` will need them:
        a worker's start-up (torch, transformers, the modes: 3-4 s) then overlaps what this process
        does before :meth:`map` (the run's probes and exact laws) instead of following it."""
        if self.workers <= 1 or tasks <= 1:
            return
        pool = self._start()
        # With spawn, each submit that finds no idle worker starts one: ``workers`` warm-ups start them all.
        for _ in range(self.workers):
            pool.submit(warm)

    def _submit(self, task: Callable, *args):
        """``task(*args)`` on the pool: measured in its worker while the run measures coverage
        (:mod:`lossless_check.running.code_coverage`); its future fails with
        :class:`~lossless_check.running.worker_loss.WorkerLost` if a worker of the pool dies first."""
        session = active_session()
        if session is not None:
            task, args = session.covered(task, args)
        task_id = next(self._task_ids)
        while True:
            pool = self._start()
            try:
                future = self._watch.track(pool.submit(on_board, task_id, task, *args), task_id)
                break
            except BrokenProcessPool:  # it broke with no task of ours running (a worker that died idle)
                self._watch.broken = True
        return future if session is None else session.unwrap(future)

    def _start(self) -> ProcessPoolExecutor:
        if self._watch is not None and self._watch.broken:
            self._replace_broken_pool()
        if self._pool is None:
            from lossless_check.running.spawn_guard import check_main_guard

            check_main_guard(self.workers)
            session = active_session()
            # Under coverage a worker measures from its start, before its imports (their import-time lines count).
            initializer, initargs = ((init_worker, ()) if session is None
                                     else (start_worker, (session.include, init_worker)))
            context = multiprocessing.get_context("spawn")
            self._watch = PoolWatch(context, self.workers)
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=join_board,
                                             initargs=(self._watch.board, initializer, initargs))
            self._watch.pool = self._pool
        return self._pool

    def _replace_broken_pool(self) -> None:
        """Forget a pool that lost a worker (its other workers are gone too); the next task starts a new one.
        Pools that keep breaking with no task to blame (a worker dying as it starts) end the run as before."""
        self._unexplained = 0 if self._watch.attributed() else self._unexplained + 1
        if self._unexplained > RETRIES:
            raise BrokenProcessPool(f"{self._unexplained} pools in a row lost a worker that ran no task")
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool, self._watch = None, None

    def close(self, stop_now: bool = False) -> None:
        """Shut the pool down; ``stop_now`` (an interrupted run) ends the cases still running too, and
        so does a chunk still running that no case needs any more (a split case stopped before it)."""
        if self._pool is not None:
            stop_now = stop_now or any(not future.done() for future in self._abandoned)
            workers = list(getattr(self._pool, "_processes", {}).values()) if stop_now else []
            self._pool.shutdown(wait=not stop_now, cancel_futures=True)
            for process in workers:
                process.terminate()
            for process in workers:
                process.join()
            self._pool = None
            self._abandoned = []

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, kind, *exc) -> None:
        # Any exception ends the run: nothing waits on its workers (a usage error found while they
        # start up is not held back until their imports finish).
        self.close(stop_now=kind is not None)


def _report(index: int, result, progress, finished) -> None:
    if finished is not None:
        finished(index, result)
    if progress is not None:
        progress(result.samples)
