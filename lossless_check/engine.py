"""The engine shared by every mode: seeds, chunks, the sequential look schedule, deadlines, the pool.

A statistical case runs as one task (in this process or on the run's pool): its trials come in
seeded chunks, and it is analysed at each look of :func:`look_schedule`. Every chunk's seed is a
function of the run seed, the case and the chunk alone, so results never depend on ``--workers``.
The pool is started once per run and every mode's cases share it.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import signal
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
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


def run_in_chunks(case, samples: int, seed: int, sequential: bool, timeout: float,
                  collect: Callable[[int, int, int], object], analyse: Callable[[list, bool], object]):
    """Collect a case's chunks look by look; return the first result ``analyse(parts, final)`` gives.

    ``collect(chunk, size, chunk_seed)`` returns one chunk of observations; ``analyse`` returns
    ``None`` to go on (a sequential case that has not stopped) and is always final at the last look.
    """
    sizes, parts = chunk_sizes(samples), []
    looks = look_schedule(samples, sequential)
    for look, n_look in enumerate(looks, 1):
        for chunk in range(len(parts), len(chunk_sizes(n_look))):
            with deadline(timeout, f"a chunk of {sizes[chunk]} trials"):
                parts.append(collect(chunk, sizes[chunk], case_seed(seed, case, chunk)))
        result = analyse(parts, look == len(looks))
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
    """Where a run's case tasks execute: this process, or a pool of worker processes started once."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def map(self, task: Callable, arguments: list[tuple], progress: Callable[[int], None] | None = None,
            cost: list[float] | None = None, finished: Callable[[int, object], None] | None = None) -> list:
        """``[task(*a) for a in arguments]``, on the pool when there is one and more than one task.

        ``progress(trials)`` is called as each task completes, with its result's ``samples``, and
        ``finished(index, result)`` too (a journal keeps it). ``cost``
        (an estimate per task) orders the pool's queue, longest first, so that a long task does not
        start last and run alone; results come back in the order of ``arguments`` either way.
        """
        if self.workers <= 1 or len(arguments) < 2:
            with one_thread():
                results = []
                for index, args in enumerate(arguments):
                    results.append(task(*args))
                    _report(index, results[-1], progress, finished)
            return results
        pool = self._start()
        order = sorted(range(len(arguments)), key=lambda i: -cost[i]) if cost else range(len(arguments))
        futures = {pool.submit(task, *arguments[i]): i for i in order}
        results: list = [None] * len(arguments)
        for future in as_completed(futures):
            index = futures[future]
            results[index] = future.result()
            _report(index, results[index], progress, finished)
        return results

    def _start(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker)
        return self._pool

    def close(self, stop_now: bool = False) -> None:
        """Shut the pool down; ``stop_now`` (an interrupted run) ends the cases still running too."""
        if self._pool is not None:
            workers = list(getattr(self._pool, "_processes", {}).values()) if stop_now else []
            self._pool.shutdown(wait=not stop_now, cancel_futures=True)
            for process in workers:
                process.terminate()
            for process in workers:
                process.join()
            self._pool = None

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


def _init_worker() -> None:
    """Initializer of a worker process of a run's pool."""
    import torch

    # Each worker owns one core: a torch thread pool per worker would oversubscribe.
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
