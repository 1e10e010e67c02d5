"""Time spent in the subject's own code during a benchmark: what no harness running it can save."""

from __future__ import annotations

import time


class SubjectTime:
    """Context manager: :attr:`seconds` spent inside ``get_candidates`` of the installed candidate generators
    (outermost calls only), i.e. in the subject's own code: what no harness running it can save."""

    def __init__(self):
        import transformers.generation.candidate_generator as module

        self.seconds, self._depth = 0.0, 0
        self._classes = [cls for cls in vars(module).values()
                         if isinstance(cls, type) and "get_candidates" in vars(cls)]

    def _timed(self, own):
        def get_candidates(*args, **kwargs):
            self._depth += 1
            started = time.perf_counter()
            try:
                return own(*args, **kwargs)
            finally:
                self._depth -= 1
                if not self._depth:
                    self.seconds += time.perf_counter() - started
        return get_candidates

    def __enter__(self) -> "SubjectTime":
        self._own = {cls: vars(cls)["get_candidates"] for cls in self._classes}
        for cls, own in self._own.items():
            cls.get_candidates = self._timed(own)
        return self

    def __exit__(self, *exc) -> None:
        for cls, own in self._own.items():
            cls.get_candidates = own
