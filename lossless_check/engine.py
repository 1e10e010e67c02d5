"""The engine shared by every mode: seeds, chunks, the sequential look schedule, deadlines, the pool.

A statistical case's trials come in seeded chunks, and it is analysed at each look of
:func:`look_schedule`. Every chunk's seed is a function of the run seed, the case and the chunk
alone, and a chunk's trials are a function of its seed alone (never of the chunks the same process
collected before), so results never depend on ``--workers`` or on where a chunk ran. A case runs as
one task, or, where it pays, split: its chunks are tasks of their own and its looks are taken in
this process (:mod:`lossless_check.scheduler`). The pool is started once per run and every mode's
cases share it.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Callable

from .errors import GeneratorFailure, NotApplicable, Timeout

#: Trials per chunk once a case is past its first few hundred trials.
CHUNK = 1000
#: The first chunks are smaller, so that a sequential run looks early (a bug is often caught within
#: a few hundred trials) and a fixed run with the same seed sees the same trials.
FIRST_CHUNKS = (125, 125, 250, 500)
#: Seconds one chunk may take before its case is an ``error`` (a hung generator).
CHUNK_TIMEOUT = 600.0


def case_seed(seed: int, case, chunk: int = 0) -> int:
    """Seed of one chunk of a case's trials: a function of the run seed, the case and the chunk alone."""
    digest = hashlib.sha256(f"{seed}|{case.key}|{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def chunk_sizes(samples: int) -> list[int]:
    """Sizes of a case's chunks: :data:`FIRST_CHUNKS`, then :data:`CHUNK` each, the last one cut."""
    sizes, total = [], 0
    while total < samples:
        size = min(FIRST_CHUNKS[len(sizes)] if len(sizes) < len(FIRST_CHUNKS) else CHUNK, samples - total)
        sizes.append(size)
        total += size
    return sizes


def look_schedule(samples: int, sequential: bool) -> list[int]:
    """Cumulative sample counts at which a case is analysed.

    Fixed-N: one look at ``samples``. Sequential: looks at 125, 250, 500, 1000, 2000, ... trials and
    at ``samples`` (the anytime test is checked at every trial; the looks only decide how much work
    is done before checking). Looks fall on chunk boundaries, so a sequential run sees exactly the
    data of the fixed-N run with the same seed, cut short.
    """
    if not sequential:
        return [samples]
    looks, n = [], FIRST_CHUNKS[0]
    while n < samples:
        looks.append(n)
        n *= 2
    return looks + [samples]


@contextmanager
def deadline(seconds: float, what: str):
    """Raise :class:`~lossless_check.errors.Timeout` in this (main) thread after ``seconds``; a no-op elsewhere."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise Timeout(f"{what} ran past {seconds:g} s: the generator hangs (or --timeout is too small)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def chunk_plan(case, samples: int, seed: int, chunk: int) -> tuple[int, int]:
    """``(size, seed)`` of chunk ``chunk`` of a case of ``samples`` trials."""
    return chunk_sizes(samples)[chunk], case_seed(seed, case, chunk)


def look_ends(samples: int, sequential: bool) -> list[int]:
    """The number of chunks each look of :func:`look_schedule` analyses."""
    return [len(chunk_sizes(n)) for n in look_schedule(samples, sequential)]


def within_deadline(timeout: float, collect: Callable[[int, int, int], object]) -> Callable[[int, int, int], object]:
    """``collect(chunk, size, chunk_seed)`` under the per-chunk deadline, as the process running it calls it."""

    def fetch(chunk: int, size: int, chunk_seed: int):
        with deadline(timeout, f"a chunk of {size} trials"):
            return collect(chunk, size, chunk_seed)

    return fetch


def kept(store, case, fetch: Callable[[int, int, int], object], state: Callable[[], object] = lambda: None,
         facts: Callable[[], object] = lambda: None) -> Callable[[int, int, int], object]:
    """``fetch`` through ``store`` (a :class:`~lossless_check.journal.ChunkStore`, or ``None``): a chunk
    kept there under the case's ``state()`` and ``facts()`` is read back, not collected again, and one
    collected is kept as soon as it is finished."""
    if store is None:
        return fetch

    def fetch_kept(chunk: int, size: int, chunk_seed: int):
        found = store.load(case.key, state(), chunk)
        if found is not None and found[1] == facts():
            return found[0]
        observations = fetch(chunk, size, chunk_seed)
        store.save(case.key, state(), chunk, observations, facts())
        return observations

    return fetch_kept


def run_in_chunks(case, samples: int, seed: int, sequential: bool,
                  fetch: Callable[[int, int, int], object], analyse: Callable[[list, bool], object]):
    """Get a case's chunks look by look; return the first result ``analyse(parts, final)`` gives.

    ``fetch(chunk, size, chunk_seed)`` returns one chunk of observations: collected here
    (:func:`within_deadline`), or by a task elsewhere (a split case, :mod:`lossless_check.scheduler`);
    either way the looks see the same chunks in chunk order. ``analyse`` returns ``None`` to go on
    (a sequential case that has not stopped) and is always final at the last look.
    """
    parts = []
    ends = look_ends(samples, sequential)
    for look, end in enumerate(ends, 1):
        for chunk in range(len(parts), end):
            parts.append(fetch(chunk, *chunk_plan(case, samples, seed, chunk)))
        result = analyse(parts, look == len(ends))
        if result is not None:
            return result
    raise AssertionError("the last look is final")


def guarded(case, run: Callable[[], object]):
    """``run()``, with a generator failure turned into an ``error`` row and a mode that does not apply
    into a ``skipped`` row (the run goes on)."""
    try:
        return run()
    except NotApplicable as exc:
        return case.result(verdict="skipped", reason=str(exc))
    except GeneratorFailure as exc:
        return case.result(verdict="error", reason=str(exc))


def make_engine(workers: int = 1, backend: str = "local", address: str | None = None):
    """The run's engine: the local pool (:class:`Engine`), or Ray (:mod:`lossless_check.ray_backend`)."""
    if backend == "ray":
        from .ray_backend import RayEngine

        return RayEngine(workers, address)
    return Engine(workers)


class Engine:
    """Where a run's tasks execute: this process, or a pool of worker processes started once."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._abandoned: list = []

    def map(self, task: Callable, arguments: list[tuple], progress: Callable[[int], None] | None = None,
            cost: list[float] | None = None, finished: Callable[[int, object], None] | None = None,
            split: Callable | None = None) -> list:
        """``[task(*a) for a in arguments]``, on the pool when there is one and it has work for more
        than one worker.

        ``progress(trials)`` is called as each task completes, with its result's ``samples``, and
        ``finished(index, result)`` too (a journal keeps it). ``cost`` (an estimate per task, in
        seconds of one core) orders the queue, longest first, so that a long task does not start last
        and run alone; ``split(*a)`` gives a task as chunks and looks (or ``None``), so that a case
        that would keep workers idle is split across them (:mod:`lossless_check.scheduler`). Results
        come back in the order of ``arguments``, and are the same either way.
        """
        from .scheduler import Scheduler, worth_a_pool

        if self.workers <= 1 or not worth_a_pool(arguments, cost, split, self.workers):
            with one_thread():
                results = []
                for index, args in enumerate(arguments):
                    results.append(task(*args))
                    _report(index, results[-1], progress, finished)
            return results
        scheduler = Scheduler(self._start().submit, self.workers)
        try:
            with one_thread():  # a split case's looks run here, as they would in a worker
                return scheduler.map(task, arguments, progress, cost, finished, split)
        finally:
            self._abandoned += scheduler.abandoned

    def _start(self) -> ProcessPoolExecutor:
        if self._pool is None:
            from .spawn_guard import check_main_guard

            check_main_guard(self.workers)
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker)
        return self._pool

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
        self.close(stop_now=kind is not None and issubclass(kind, KeyboardInterrupt))


def _report(index: int, result, progress, finished) -> None:
    if finished is not None:
        finished(index, result)
    if progress is not None:
        progress(result.samples)


@contextmanager
def one_thread():
    """One torch thread while cases run here, as in a worker: the harness's tensors are tiny, and
    several processes of a machine (pytest-xdist workers) each with a thread pool oversubscribe its
    cores (measured: the README's downstream example took 94 s under ``pytest -n 2``, 18 s serially).
    The caller's setting is restored."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


#: Seconds between a worker's checks that the run that started it is still there.
ORPHAN_POLL_SECONDS = 1.0


def _init_worker() -> None:
    """Initializer of a worker process of a run's pool."""
    import os

    import torch

    # A run killed outright (SIGKILL: an OOM killer, a CI time-out) cannot stop its workers: each
    # stops itself once its parent is gone, instead of burning a core on a case no one will read
    # (and racing the resumed run for the machine).
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="lossless-orphan-watch", daemon=True).start()

    # Each worker owns one core: a torch thread pool per worker would oversubscribe.
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
