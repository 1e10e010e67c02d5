"""A script that starts a run's worker processes must guard its top level.

The local pool starts its workers with multiprocessing's ``spawn`` (``fork`` is unsafe beside torch's
thread pools and the run's own threads), and a spawned worker first imports the caller's main script
again, as ``__mp_main__``. A script that calls ``lc.run(..., workers=2)`` outside
``if __name__ == "__main__":`` would call it again in every worker, which dies before taking any work
(``BrokenProcessPool``, after every worker has re-run the script). :func:`check_main_guard` refuses
that in one line, before any worker starts.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from lossless_check.core.errors import UsageError


def check_main_guard(workers: int) -> None:
    """Raise :class:`UsageError` if this call runs from the top level of a main script that spawned
    workers would import again, outside an ``if __name__ == "__main__":`` block.

    Nothing is refused where spawn does not import the main module again (an interactive session,
    ``python -c``, a notebook, a package's ``__main__``), nor where the script's source cannot be read.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if path is None or name.endswith("__main__"):  # multiprocessing.spawn skips these too
        return
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:  # the script's top level is not running this call (a function it called later)
        return
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return
    if not _guarded(tree, frame.f_lineno):
        raise UsageError(f"workers={workers} starts worker processes, and each imports {path} again: its line "
                         f"{frame.f_lineno} would run again in every worker; put the script's calls under "
                         "`if __name__ == \"__main__\":` (or use workers=1)")


def _guarded(tree: ast.Module, line: int) -> bool:
    """Whether ``line`` lies in a block of an ``if`` that tests ``__name__`` against ``"__main__"``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _tests_main(node.test) and node.lineno <= line <= node.end_lineno:
            return True
    return False


def _tests_main(test: ast.expr) -> bool:
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    constants = {n.value for n in ast.walk(test) if isinstance(n, ast.Constant)}
    return "__name__" in names and "__main__" in constants
