"""``--backend ray``: a run's case tasks on a Ray cluster (``pip install -e '.[ray]'``).

The same tasks as the local pool (:class:`~lossless_check.engine.Engine`): one per case, each seeded
from the run seed and the case alone, so a run gives the same JSON on Ray as on ``--workers W``.
Tasks are queued longest first; a worker or node lost mid-task costs a retry of that task
(:data:`RETRIES`), never a case. The driver's ``sys.path`` goes to the workers, so ``module:attr``
generators resolve there as here.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from .engine import _init_worker, _report
from .errors import UsageError

#: Times Ray runs a task again after its worker or node died.
RETRIES = 3
_READY = {"worker": False}


def _run_task(task: Callable, args: tuple):
    """A case task in a Ray worker, set up as a pool worker is (one torch thread, quiet transformers)."""
    if not _READY["worker"]:
        _init_worker()
        _READY["worker"] = True
    return task(*args)


class RayEngine:
    """Where a run's case tasks execute on Ray: ``address`` an existing cluster (``ray start``), or
    ``None`` for a local instance of ``workers`` CPUs."""

    def __init__(self, workers: int = 1, address: str | None = None):
        try:
            import ray
        except ImportError:
            raise UsageError("--backend ray needs Ray: pip install -e '.[ray]'") from None
        self._ray = ray
        self._started = not ray.is_initialized()
        if self._started:
            paths = os.pathsep.join(p for p in sys.path if p)
            ray.init(address=address, num_cpus=None if address else workers, include_dashboard=False,
                     log_to_driver=False, logging_level="ERROR", ignore_reinit_error=True,
                     runtime_env={"env_vars": {"PYTHONPATH": paths, "OMP_NUM_THREADS": "1"}})
        self._remote = ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=False)(_run_task)

    def map(self, task: Callable, arguments: list[tuple], progress: Callable[[int], None] | None = None,
            cost: list[float] | None = None, finished: Callable[[int, object], None] | None = None) -> list:
        """As :meth:`lossless_check.engine.Engine.map`, each task a Ray task."""
        order = sorted(range(len(arguments)), key=lambda i: -cost[i]) if cost else range(len(arguments))
        pending = {self._remote.remote(task, arguments[i]): i for i in order}
        results: list = [None] * len(arguments)
        try:
            while pending:
                done, _ = self._ray.wait(list(pending), num_returns=1)
                index = pending.pop(done[0])
                results[index] = self._ray.get(done[0])
                _report(index, results[index], progress, finished)
        except KeyboardInterrupt:
            for ref in pending:
                self._ray.cancel(ref, force=True)
            raise
        return results

    def close(self, stop_now: bool = False) -> None:
        if self._started and self._ray.is_initialized():
            self._ray.shutdown()
            self._started = False

    def __enter__(self) -> "RayEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
