"""A case's trials in seeded chunks: their sizes and seeds, the sequential look schedule, deadlines.

Every chunk's seed is a function of the run seed, the case and the chunk alone, and a chunk's trials
are a function of its seed alone (never of the chunks the same process collected before), so results
never depend on ``--workers`` or on where a chunk ran. A case is analysed at each look of
:func:`look_schedule`. Imports only :mod:`lossless_check.core`.
"""

from __future__ import annotations

import hashlib
import signal
import threading
from contextlib import contextmanager
from typing import Callable

from lossless_check.core.errors import GeneratorFailure, NotApplicable, Timeout

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
    """Raise :class:`~lossless_check.core.errors.Timeout` in this (main) thread after ``seconds``; a no-op elsewhere."""
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
    """``fetch`` through ``store`` (a :class:`~lossless_check.running.journal.ChunkStore`, or ``None``): a chunk
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
    (:func:`within_deadline`), or by a task elsewhere (a split case, :mod:`lossless_check.running.scheduler`);
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
