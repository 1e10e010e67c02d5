"""Which code a run executed: coverage.py in this process and in every worker process and Ray task.

:func:`collecting` starts a :class:`coverage.Coverage` here (statements and branches of the given files
only) and makes it the run's session (:func:`active_session`). While it is active, the engines
(:class:`~lossless_check.running.engine.Engine`, :class:`~lossless_check.running.ray_backend.RayEngine`)
send each task through :func:`covered_call`: the worker measures with its own ``Coverage`` (started once per
process, before the task's arguments are unpickled, so the modules they import count their import-time lines)
and returns its data beside the task's result; :meth:`Session.unwrap` hands the result on and merges the data.
Coverage data is a union of lines and arcs, so a worker returning everything it measured so far with every
task loses nothing and double-counts nothing, and a Ray node need share no file system with the driver.

A process that imported a measured module before its coverage started never traced that module's import-time
lines (its ``def`` and ``class`` statements): where this process did, a fresh interpreter imports those
modules under coverage, in the background, and its data is merged too (:func:`_import_time_data`).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from concurrent.futures import Future
from contextlib import contextmanager

_ACTIVE: list["Session"] = []
#: This process's worker-side Coverage, by the files it measures.
_HERE: dict[tuple[str, ...], object] = {}


def new_coverage(include: tuple[str, ...]):
    """A ``coverage.Coverage`` of the files ``include`` (statements and branches), keeping its data in memory."""
    import coverage

    cov = coverage.Coverage(data_file=None, branch=True, include=list(include), config_file=False)
    # This process may run no measured code at all (a driver whose workers run every case): not a problem.
    cov.set_option("run:disable_warnings", ["no-data-collected"])
    return cov


def measure_here(include: tuple[str, ...]):
    """Start measuring ``include`` in this (worker) process, once; return its ``Coverage``."""
    cov = _HERE.get(include)
    if cov is None:
        cov = _HERE[include] = new_coverage(include)
        cov.start()
    return cov


def covered_call(include: tuple[str, ...], payload: bytes) -> tuple[tuple[str, object], tuple[int, bytes]]:
    """Run the task pickled in ``payload`` (``(fn, args)``) measuring ``include``: ``((kind, value), (pid, data))``
    with ``kind`` ``"ok"`` (``value`` its result) or ``"raised"`` (the exception), and ``data`` everything this
    process (``pid``) measured so far (``CoverageData.dumps()``)."""
    cov = measure_here(include)
    try:
        fn, args = pickle.loads(payload)
        outcome = ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the task's own exception, raised again where it was submitted
        outcome = ("raised", exc)
    return outcome, (os.getpid(), cov.get_data().dumps())


def start_worker(include: tuple[str, ...], initializer) -> None:
    """A pool worker's initializer under coverage: measure first, then ``initializer()``."""
    measure_here(include)
    initializer()


class Session:
    """The coverage of one run: this process's measurement and what its workers send back."""

    def __init__(self, include: tuple[str, ...], modules: tuple[str, ...] = ()):
        self.include = tuple(include)
        self.coverage = new_coverage(self.include)
        # Each worker's latest data, by process: a worker's data holds everything it measured so far. (Kept as
        # bytes and merged by finish(): in-memory coverage data lives in the thread that wrote it, and the
        # futures' callbacks run in another.)
        self._received: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self.tasks = 0
        self.finished = False
        imported = [m for m in modules if m in sys.modules]
        self._importer = _import_time_data(self.include, imported) if imported else None

    def covered(self, task, args: tuple) -> tuple:
        """``(fn, args)`` to submit in place of ``(task, args)``: the task measured in its worker."""
        return covered_call, (self.include, pickle.dumps((task, args)))

    def unwrap(self, inner: Future) -> Future:
        """The future of the task's own result, from ``inner``, the future of :func:`covered_call`'s; the
        worker's data is merged as it arrives."""
        outer: Future = Future()

        def done(future: Future) -> None:
            if future.cancelled():
                outer.cancel()
                return
            error = future.exception()
            if error is not None:
                outer.set_exception(error)
                return
            (kind, value), data = future.result()
            self.receive(data)
            if kind == "raised":
                outer.set_exception(value)
            else:
                outer.set_result(value)

        inner.add_done_callback(done)
        return outer

    def receive(self, measured: tuple[int, bytes]) -> None:
        """Keep what worker process ``pid`` measured so far (``measured``: ``(pid, data)``)."""
        pid, data = measured
        with self._lock:
            self._received[pid] = data
            self.tasks += 1

    @property
    def processes(self) -> int:
        """Processes whose measurements the report merges: this one and each worker that ran a task."""
        with self._lock:
            return 1 + len(self._received)

    def finish(self):
        """Stop measuring here; this process's ``Coverage`` with every worker's data merged into it."""
        self.coverage.stop()
        self.finished = True
        from coverage import CoverageData

        data = self.coverage.get_data()
        with self._lock:
            blobs = list(self._received.values())
        if self._importer is not None:
            out, _ = self._importer.communicate()
            if self._importer.returncode == 0 and out:
                blobs.append(out)
        for blob in blobs:
            received = CoverageData(no_disk=True)
            received.loads(blob)
            data.update(received)
        return self.coverage


def _import_time_data(include: tuple[str, ...], modules: list[str]) -> subprocess.Popen:
    """A fresh interpreter importing ``modules`` under coverage of ``include``; it prints the data (bytes)."""
    code = ("import sys, coverage\n"
            f"cov = coverage.Coverage(data_file=None, branch=True, include={list(include)!r}, config_file=False)\n"
            "cov.start()\n"
            "import importlib\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "cov.stop()\n"
            "sys.stdout.buffer.write(cov.get_data().dumps())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)


def active_session() -> Session | None:
    """The session of the run under way in this process, if it measures coverage."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextmanager
def collecting(include: tuple[str, ...], modules: tuple[str, ...] = ()):
    """Measure ``include`` (file paths) here and in every task the engines run while the block runs; yields the
    :class:`Session`, whose :meth:`Session.finish` the block's owner calls for the merged data. ``modules``: the
    dotted names of the measured modules (imported again in a fresh process if this one already had them)."""
    session = Session(include, modules)
    session.coverage.start()
    _ACTIVE.append(session)
    try:
        yield session
    finally:
        _ACTIVE.remove(session)
        if not session.finished:  # the block ended without finish(): stop measuring all the same
            session.coverage.stop()


__all__ = ["Session", "active_session", "collecting", "covered_call", "measure_here", "start_worker"]
