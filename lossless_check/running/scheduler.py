"""What a run's workers do next: case tasks, and the chunks of the cases split across them.

Backend-agnostic: a ``submit(fn, *args) -> concurrent.futures.Future`` (the local process pool of
:class:`~lossless_check.running.engine.Engine`, or Ray: :mod:`lossless_check.running.ray_backend`) and a number of
slots (workers). A slot holds one task at a time, and what a free slot takes next is chosen here:

1. a chunk that a split case's next look needs (its analysis waits on it);
2. the next case, longest first: one task, or split where that pays (:func:`should_split`);
3. a chunk a split case needs later if it goes on (a clean case goes on to the end): work for a
   slot that would otherwise idle, wasted only if the case stops first.

A split case's looks run in a thread of this process: the very loop a whole case runs
(:func:`~lossless_check.running.chunks.run_in_chunks`, in the mode's ``run(fetch)``), fed its chunks in chunk
order whatever order they finish in. This process keeps each chunk a worker returns
(``run.keep``) and starts from the chunks an interrupted run kept (``run.kept_outcomes``): a node
that shares no file system with this one loses nothing either. A chunk's trials are a function of
its seed alone, so the result is the unsplit run's, whatever the number of workers. A chunk collected under other
``facts`` than this process's (a fast tokenizer's vocabulary order is random per process) would not
be, so such a case runs whole instead.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable

from lossless_check.core.errors import GeneratorFailure
from lossless_check.running.chunks import chunk_plan, look_ends
from lossless_check.running.worker_loss import RETRIES, WorkerLoss, WorkerLost

#: A case splits only if it is expected to take at least this many seconds of one core: a worker
#: collecting its chunks first builds its stubs and generator (a second or two), and so does this
#: process, for the looks; a small case would lose more than it gains.
MIN_SPLIT_SECONDS = 20.0
#: Split cases a worker keeps built between chunks (a 32,000-token case holds its target-logits cache).
KEPT_RUNS = 2
#: Seconds the driver waits for an event before looking again (so that SIGINT and SIGTERM get through).
POLL_SECONDS = 0.5


def should_split(cost: float, unstarted_cost: float, unstarted: int, slots: int) -> bool:
    """Whether a case of estimated ``cost`` (seconds of one core) splits as it starts, with ``unstarted``
    cases (itself included, ``unstarted_cost`` in all) left to start on ``slots`` workers.

    It pays where workers would otherwise idle: fewer cases left than workers (a run's tail, or a run
    of one case), or a case longer than its share of what is left (it would end the run alone).
    """
    if slots < 2 or cost < MIN_SPLIT_SECONDS:
        return False
    return unstarted < slots or cost > unstarted_cost / slots


def worth_a_pool(arguments: list[tuple], cost: list[float] | None, split: Callable | None, slots: int) -> bool:
    """Whether tasks ``arguments`` keep more than one worker busy: several tasks, or one that splits."""
    if len(arguments) != 1:
        return len(arguments) > 1
    return (split is not None and cost is not None and should_split(cost[0], cost[0], 1, slots)
            and split(*arguments[0]) is not None)


_RUNS: OrderedDict = OrderedDict()


def collect_chunk(split: Callable, arguments: tuple, token: str, state, chunk: int) -> tuple:
    """One chunk of a split case, in a worker: ``("ok", observations, facts)``, or ``("raised", exc)``
    (re-raised where the case's looks reach that chunk, as a whole run would raise it there)."""
    key = (token, state)
    run = _RUNS.pop(key, None)
    if run is None:
        run = split(*arguments)
        run.restore(state)
    _RUNS[key] = run
    while len(_RUNS) > KEPT_RUNS:
        _RUNS.popitem(last=False)
    try:
        observations = run.collect_here(chunk, *chunk_plan(run.case, run.samples, run.seed, chunk))
        return "ok", observations, run.facts()
    except Exception as exc:  # noqa: BLE001 - the case's own failure, raised again in its looks
        return "raised", exc


class _Cancelled(BaseException):
    """The run stopped (SIGINT, SIGTERM, an internal error): a split case's thread ends."""


class _NotSplittable(Exception):
    """A chunk was collected under other facts than this process's: the case runs whole."""


class SplitCase:
    """One case whose chunks are tasks and whose looks run in a thread of this process."""

    def __init__(self, index: int, run, split: Callable, arguments: tuple, token: str, events: queue.Queue):
        self.index, self.run, self.split, self.arguments, self.token = index, run, split, arguments, token
        self.events = events
        self.ends = look_ends(run.samples, run.sequential)
        self.cond = threading.Condition()
        self.state = run.state
        self.outcomes: dict[int, tuple] = run.kept_outcomes(self.state)  # what an interrupted run finished
        self.submitted: set[int] = set()
        self.wanted = 0
        self.over = False
        self.result = self.error = None
        self.thread = threading.Thread(target=self._main, name=f"lossless-split-{index}", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.result = self.run.run(self.fetch)
            self.events.put(("case", self))
        except _NotSplittable:
            self.events.put(("whole", self))
        except _Cancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - an internal error: the driver raises it
            self.error = exc
            self.events.put(("failed", self))

    def fetch(self, chunk: int, size: int, chunk_seed: int):
        """The looks' ``fetch``: chunk ``chunk``, once a worker has collected it (``size`` and
        ``chunk_seed`` are the worker's to compute, from the same plan)."""
        with self.cond:
            if self.run.state != self.state:  # the case started again (at batch 1): new chunks
                self.state, self.submitted = self.run.state, set()
                self.outcomes = self.run.kept_outcomes(self.state)
            self.wanted = chunk
            self.events.put(("need", self))
            while chunk not in self.outcomes and not self.over:
                self.cond.wait()
            if self.over:
                raise _Cancelled
            outcome = self.outcomes[chunk]
        if outcome[0] == "raised":
            raise outcome[1]
        if outcome[2] != self.run.facts():
            raise _NotSplittable
        return outcome[1]

    def next_chunk(self, ahead: bool) -> tuple | None:
        """Arguments of :func:`collect_chunk` for a free slot: a chunk the next look needs, or with
        ``ahead`` one a later look needs; ``None`` if there is none."""
        with self.cond:
            if self.over or self.run.state != self.state:
                return None
            limit = self.ends[-1] if ahead else next(end for end in self.ends if end > self.wanted)
            for chunk in range(limit):
                if chunk not in self.submitted and chunk not in self.outcomes:
                    self.submitted.add(chunk)
                    return self.split, self.arguments, self.token, self.state, chunk
        return None

    def deliver(self, state, chunk: int, outcome: tuple) -> None:
        """A chunk a worker finished: kept (on disk, where the run keeps chunks) before the looks see it,
        unless the case is decided (a chunk collected ahead that it did not need)."""
        if self.result is None:
            self.run.keep(state, chunk, outcome)
        with self.cond:
            if state == self.state:
                self.outcomes[chunk] = outcome
                self.cond.notify_all()

    def end(self) -> None:
        """No more chunks (the case is decided, runs whole, or the run stops)."""
        with self.cond:
            self.over = True
            self.cond.notify_all()


class Scheduler:
    """Runs a run's tasks on ``slots`` workers through ``submit``; see the module's docstring."""

    def __init__(self, submit: Callable[..., Future], slots: int, split_every: bool = False):
        self.submit, self.slots = submit, slots
        #: Split every case that can split, not only where it pays in time: on a cluster, so that a lost
        #: node costs the chunks it was running, never a whole case (:mod:`lossless_check.running.ray_backend`).
        self.split_every = split_every
        #: Chunk tasks still running when :meth:`map` returned (a split case stopped before them).
        self.abandoned: list[Future] = []

    def map(self, task: Callable, arguments: list[tuple], progress: Callable[[int], None] | None = None,
            cost: list[float] | None = None, finished: Callable[[int, object], None] | None = None,
            split: Callable | None = None, lost: Callable[[WorkerLoss], object] | None = None) -> list:
        """As :meth:`lossless_check.running.engine.Engine.map`; ``split(*arguments[i])`` gives case ``i`` as
        chunks and looks (``None``: it runs as one task), for the cases :func:`should_split` picks.

        A task that fails with :class:`~lossless_check.running.worker_loss.WorkerLost` runs again, unless its own
        worker died more than :data:`~lossless_check.running.worker_loss.RETRIES` times running it: a chunk then
        raises :class:`~lossless_check.core.errors.GeneratorFailure` in its case's looks (the case's ``error``), and
        a whole case's result is what ``lost(loss)`` returns. ``lost`` hears of every lost task (default: a
        whole case not run again is an internal error)."""
        costs = cost or [0.0] * len(arguments)
        unstarted = sorted(range(len(arguments)), key=lambda i: -costs[i])
        results: list = [None] * len(arguments)
        left = len(arguments)
        events: queue.Queue = queue.Queue()
        running: dict[Future, tuple] = {}  # a task's tag, function and arguments
        deaths: dict[tuple, int] = {}  # times a task's own worker died running it
        splits: list[SplitCase] = []
        whole: set[int] = set()
        token = uuid.uuid4().hex

        def launch(fn, args: tuple, tag: tuple) -> None:
            future = self.submit(fn, *args)
            running[future] = tag, fn, args
            future.add_done_callback(lambda done: events.put(("task", done)))

        def chunk_for(ahead: bool) -> tuple | None:
            for case in splits:
                found = case.next_chunk(ahead)
                if found is not None:
                    return case, found
            return None

        def fill() -> None:
            while len(running) < self.slots:
                found = chunk_for(ahead=False)
                if found is None and unstarted:
                    i = unstarted.pop(0)
                    run = None
                    if split is not None and i not in whole and (self.split_every or should_split(
                            costs[i], costs[i] + sum(costs[j] for j in unstarted), len(unstarted) + 1, self.slots)):
                        run = split(*arguments[i])
                    if run is None:
                        launch(task, arguments[i], ("case", i))
                    else:
                        splits.append(SplitCase(i, run, split, arguments[i], f"{token}-{i}", events))
                    continue
                found = found or chunk_for(ahead=True)
                if found is None:
                    return
                case, args = found
                launch(collect_chunk, args, ("chunk", case, args[3], args[4]))

        def redo(tag: tuple, fn: Callable, args: tuple, error: WorkerLost) -> None:
            index, chunk = (tag[1], None) if tag[0] == "case" else (tag[1].index, tag[3])
            key = (index, chunk, None if chunk is None else tag[2])
            deaths[key] = deaths.get(key, 0) + error.culprit
            final = error.final or deaths[key] > RETRIES
            reason = f"{error.reason} {deaths[key]} times" if final and not error.final else error.reason
            if tag[0] == "chunk" and (tag[1].over or tag[1].result is not None):
                return  # a chunk its case no longer needs
            loss = WorkerLoss(index, chunk, reason, redone=not final)
            decided = lost(loss) if lost is not None else None
            if not final:
                launch(fn, args, tag)
            elif tag[0] == "chunk":
                tag[1].deliver(tag[2], chunk, ("raised", GeneratorFailure(f"{reason} running chunk {chunk}")))
            elif decided is None:
                raise error
            else:
                done(index, decided)

        def done(index: int, result) -> None:
            nonlocal left
            results[index] = result
            left -= 1
            if finished is not None:
                finished(index, result)
            if progress is not None:
                progress(result.samples)

        try:
            while left:
                fill()
                try:
                    kind, item = events.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    continue
                if kind == "task":
                    tag, fn, args = running.pop(item)
                    error = None if item.cancelled() else item.exception()
                    if isinstance(error, WorkerLost):
                        redo(tag, fn, args, error)
                    elif tag[0] == "case":
                        done(tag[1], item.result())
                    else:
                        tag[1].deliver(tag[2], tag[3], item.result())
                elif kind == "case":
                    item.end()
                    splits.remove(item)
                    done(item.index, item.result)
                elif kind == "whole":
                    item.end()
                    splits.remove(item)
                    whole.add(item.index)
                    unstarted.insert(0, item.index)
                elif kind == "failed":
                    raise item.error
        finally:
            for case in splits:
                case.end()
            self.abandoned = [future for future in running if not future.done()]
        return results
