"""Long runs lose nothing: finished cases journaled as they finish, reports written atomically.

A run with a report path keeps an append-only journal beside it (``report.json.journal.jsonl``; the
gate's in its report directory): a header naming the run (seed, alpha, samples, the transformers
release, every case's key in order), then one line per finished case with its result *before* the
family-wise decision. ``--resume`` reads it back and runs only the cases it lacks; the decision
(Holm) is then taken over all cases at the end, so a resumed run ends with the JSON, verdicts and
p-values an uninterrupted run with that seed gives (each case's trials depend on the seed and the
case alone). A journal written by another run (other cases, seed, alpha, samples, release) is
refused with a usage error, never mixed in.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UsageError

if TYPE_CHECKING:  # the path checks run before anything heavy is imported
    from .results import CaseResult

#: What a journal's name adds to its report's.
SUFFIX = ".journal.jsonl"


def journal_for(report: str | Path) -> Path:
    """The journal beside ``report``."""
    report = Path(report)
    return report.with_name(report.name + SUFFIX)


def run_identity(cases, samples: int, alpha: float, seed: int, sequential: bool, batch_size) -> dict:
    """What a run's journal must agree on before its cases are reused."""
    from .compat import versions

    return {"seed": seed, "alpha": alpha, "samples": samples, "sequential": sequential, "batch_size": batch_size,
            **versions(), "cases": [case.key for case in cases]}


class Journal:
    """The finished cases of one run (:attr:`done`, by case index), appended to ``path`` as they finish."""

    def __init__(self, path: str | Path, identity: dict, resume: bool):
        self.path = Path(path)
        self.done: dict[int, CaseResult] = {}
        if resume:
            if not self.path.exists():
                raise UsageError(f"nothing to resume: no journal at {self.path}")
            lines = self.path.read_text().splitlines()
            header = json.loads(lines[0]) if lines else None
            if header != identity:
                raise UsageError(f"the journal at {self.path} is another run's (other cases, seed, alpha, samples or "
                                 "release): run without --resume to start afresh")
            for line in lines[1:]:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # the last line of a run killed while writing it
                    continue
                self.done[entry["index"]] = result_from_dict(entry)
        else:
            self.path.write_text(json.dumps(identity) + "\n")

    def record(self, index: int, result: CaseResult) -> None:
        """Append one finished case, on disk before this returns."""
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"index": index, **result_to_dict(result)}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.done[index] = result


def result_to_dict(result: CaseResult) -> dict:
    """A result as a journal line's fields: its class (a mode may add fields to :class:`CaseResult`, e.g.
    :class:`~lossless_check.modes.generate.GenerateCaseResult`) and every field."""
    kind = type(result)
    return {"class": f"{kind.__module__}:{kind.__qualname__}", "result": dataclasses.asdict(result)}


def result_from_dict(entry: dict) -> CaseResult:
    """The result :func:`result_to_dict` wrote, of its own class."""
    import importlib

    from .results import CaseResult

    module, _, name = entry.get("class", "lossless_check.results:CaseResult").partition(":")
    kind = getattr(importlib.import_module(module), name) if module.startswith("lossless_check.") else None
    if not (isinstance(kind, type) and issubclass(kind, CaseResult)):
        raise ValueError(f"a journal entry names {entry['class']}, which is no CaseResult")
    fields = dict(entry["result"])
    if fields.get("tv_ci") is not None:
        fields["tv_ci"] = tuple(fields["tv_ci"])
    return kind(**fields)


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def check_writable_file(path: str, option: str) -> None:
    """Raise :class:`UsageError` unless a file can be written at ``path`` (before any work)."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    _check_writable_dir(target.parent if str(target.parent) else Path("."), f"{option} {path}")


def check_writable_dir(path: str, option: str) -> None:
    """Raise :class:`UsageError` unless ``path`` is, or can be made, a writable directory."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{option} {path}: exists and is not a directory")
    existing = target
    while not existing.exists():
        existing = existing.parent
    _check_writable_dir(existing, f"{option} {path}")


def _check_writable_dir(directory: Path, what: str) -> None:
    """A file made and removed in ``directory``: permissions alone say nothing to root or of a
    read-only file system."""
    import tempfile

    if not directory.exists():
        raise UsageError(f"{what}: directory {directory} does not exist")
    if not directory.is_dir():
        raise UsageError(f"{what}: {directory} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise UsageError(f"{what}: cannot write in {directory} ({exc.strerror})") from None
