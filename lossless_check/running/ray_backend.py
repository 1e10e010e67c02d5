"""``--backend ray``: a run's tasks on a Ray cluster (``pip install -e '.[ray]'``).

The same tasks as the local pool (:class:`~lossless_check.running.engine.Engine`), chosen by the same
:class:`~lossless_check.running.scheduler.Scheduler`: one per case, or one per chunk of a case split across
the cluster's CPUs, each seeded from the run seed, the case and the chunk alone, so a run gives the
same JSON on Ray as on ``--workers W``. Every case that can be split is (step mode: each chunk a
task, its looks in the driver), so a worker or node lost mid-task costs Ray's retry of the chunks it
was running (Ray's ``max_retries``: :data:`~lossless_check.running.worker_loss.RETRIES`), never a case; a
task whose worker died every time is its case's ``error`` (:class:`~lossless_check.running.worker_loss.WorkerLost`),
and the run goes on. A case that runs as one task (generate mode) resumes on
retry from the chunks it kept, where the run keeps chunks on a file system its nodes share
(:func:`lossless_check.faces.api.run_cases`). The driver's ``sys.path`` goes to the workers, so
``module:attr`` generators resolve there as here.
"""

from __future__ import annotations

import os
import socket
import sys
from concurrent.futures import Future
from typing import Callable

from lossless_check.core.errors import UsageError
from lossless_check.running.worker_loss import RETRIES, WorkerLost, translated
from lossless_check.running.workers import init_worker, one_thread

#: Ray's errors for a task whose worker or node died (after its retries): each a :class:`WorkerLost`.
LOST_WORKER_ERRORS = ("WorkerCrashedError", "OutOfMemoryError", "NodeDiedError", "LocalRayletDiedError")
#: Seconds to wait for the cluster's address to accept a connection before calling it unreachable
#: (``ray.init`` itself retries for minutes, logging as it goes).
CONNECT_SECONDS = 5.0
_READY = {"worker": False}


def _run_task(task: Callable, args: tuple):
    """A task in a Ray worker, set up as a pool worker is (one torch thread, quiet transformers)."""
    if not _READY["worker"]:
        init_worker()
        _READY["worker"] = True
    return task(*args)


def check_address(address: str) -> None:
    """Raise :class:`UsageError` unless something accepts connections at ``address`` (``HOST:PORT``
    or ``ray://HOST:PORT``; ``auto`` is left to Ray)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--address {address}: expected HOST:PORT (as `ray start --head` prints)")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as exc:
        raise UsageError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc}); "
                         f"start one with `ray start --head --port {port}`") from None


def connect(workers: int, address: str | None):
    """``ray``, initialised on the cluster at ``address`` (or a local instance of ``workers`` CPUs);
    ``(ray, started)``: ``started`` says whether this call connected (and :func:`disconnect` should)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--backend ray needs Ray: pip install -e '.[ray]'") from None
    if ray.is_initialized():
        return ray, False
    if address:
        check_address(address)
    paths = os.pathsep.join(p for p in sys.path if p)
    ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
             log_to_driver=False, logging_level="ERROR", ignore_reinit_error=True,
             runtime_env={"env_vars": {"PYTHONPATH": paths, "OMP_NUM_THREADS": "1"}})
    return ray, True


class RayEngine:
    """Where a run's tasks execute on Ray: ``address`` an existing cluster (``ray start``), or
    ``None`` for a local instance of ``workers`` CPUs."""

    def __init__(self, workers: int = 1, address: str | None = None):
        self._ray, self._started = connect(workers, address)
        self._remote = self._ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=False)(_run_task)
        self._refs: dict[Future, object] = {}
        self._lost_worker_errors = tuple(getattr(self._ray.exceptions, name) for name in LOST_WORKER_ERRORS)

    @property
    def slots(self) -> int:
        """Tasks the cluster runs at once: its CPUs (each task takes one)."""
        return max(1, int(self._ray.cluster_resources().get("CPU", 1)))

    def _submit(self, task: Callable, *args) -> Future:
        from lossless_check.running.code_coverage import active_session

        session = active_session()  # the run measures coverage: the task is measured in its Ray worker
        if session is not None:
            task, args = session.covered(task, args)
        ref = self._remote.remote(task, args)
        future = _lost_worker_translated(ref.future(), self._lost_worker_errors)
        future = future if session is None else session.unwrap(future)
        self._refs[future] = ref
        future.add_done_callback(lambda done: self._refs.pop(done, None))
        return future

    def map(self, task: Callable, arguments: list[tuple], progress: Callable[[int], None] | None = None,
            cost: list[float] | None = None, finished: Callable[[int, object], None] | None = None,
            split: Callable | None = None, lost: Callable | None = None) -> list:
        """As :meth:`lossless_check.running.engine.Engine.map`, each task a Ray task (Ray runs one whose worker
        died again itself: ``lost`` hears only of a task that died every time)."""
        from lossless_check.running.scheduler import Scheduler

        scheduler = Scheduler(self._submit, self.slots, split_every=True)
        try:
            with one_thread():  # a split case's looks run here, as they would in a worker
                return scheduler.map(task, arguments, progress, cost, finished, split, lost)
        except KeyboardInterrupt:
            self._cancel(list(self._refs.values()), force=True)
            raise
        finally:
            # Chunks that no case needs any more (a split case stopped first): stop them.
            self._cancel([self._refs[f] for f in scheduler.abandoned if f in self._refs], force=False)

    def _cancel(self, refs: list, force: bool) -> None:
        for ref in refs:
            try:
                self._ray.cancel(ref, force=force)
            except Exception:  # noqa: BLE001 - a task that just finished cannot be cancelled
                pass

    def close(self, stop_now: bool = False) -> None:
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
            self._started = False

    def start_early(self, tasks: int, warm: Callable[[], None]) -> None:
        """Nothing: Ray's workers start with the cluster."""

    def __enter__(self) -> "RayEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _lost_worker_translated(inner: Future, lost_worker_errors: tuple[type, ...]) -> Future:
    """``inner``, with Ray's error for a task whose worker died :data:`RETRIES` + 1 times turned into a final
    :class:`WorkerLost` (the scheduler makes it its case's ``error``)."""

    def lost(error: BaseException) -> BaseException:
        if not isinstance(error, lost_worker_errors):
            return error
        first_line = (str(error).strip().splitlines() or [""])[0]
        return WorkerLost(f"Ray worker lost ({type(error).__name__}: {first_line[:200]}) {RETRIES + 1} times",
                          culprit=True, final=True)

    return translated(inner, lost)


def check_backend(args) -> None:
    """``--address`` names a reachable Ray cluster, and only with ``--backend ray`` (before any work)."""
    if getattr(args, "address", None):
        if args.backend != "ray":
            raise UsageError("--address needs --backend ray")
        check_address(args.address)
