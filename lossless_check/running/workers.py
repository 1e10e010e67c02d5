"""What every process that runs cases sets up: one torch thread, and a worker that stops when its run is gone."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


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


def init_worker() -> None:
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
