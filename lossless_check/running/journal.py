"""Long runs lose nothing: finished chunks and cases kept as they finish, reports written atomically.

A run with a report path keeps an append-only journal beside it (``report.json.journal.jsonl``; the
gate's in its report directory): a header naming the run (seed, alpha, samples, the transformers
release, every case's key in order), then one line per finished case with its result *before* the
family-wise decision. Beside it, a :class:`ChunkStore` (``report.json.journal.chunks/``) keeps every
finished chunk of trials of a case still running (the engine's seeded chunks: the unit of work), on
disk before anything else is done with it, so a SIGKILL loses at most the chunks then running.

``--resume`` reads both back: it runs only the cases the journal lacks, and within them only the
chunks the store lacks. The looks (and the sequential test's running e-values, products over the
trials in chunk order) are taken again over the same trials in the same order, so they go on from
where the killed run was, never start afresh; the decision (Holm) is taken over all cases at the end.
A chunk's trials are a function of the seed, the case and the chunk alone, so a resumed run ends with
the JSON, verdicts and p-values of an uninterrupted run with that seed, bit for bit. A journal
written by another run (other cases, seed, alpha, samples, release) is refused with a usage error,
never mixed in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from lossless_check.core.errors import UsageError

if TYPE_CHECKING:  # the path checks run before anything heavy is imported
    from lossless_check.evidence.results import CaseResult

#: What a journal's name adds to its report's.
SUFFIX = ".journal.jsonl"


def journal_for(report: str | Path) -> Path:
    """The journal beside ``report``."""
    report = Path(report)
    return report.with_name(report.name + SUFFIX)


def run_identity(cases, samples: int, alpha: float, seed: int, sequential: bool, batch_size) -> dict:
    """What a run's journal must agree on before its cases are reused."""
    from lossless_check.core.compat import versions

    return {"seed": seed, "alpha": alpha, "samples": samples, "sequential": sequential, "batch_size": batch_size,
            **versions(), "cases": [case.key for case in cases]}


class EntryLog:
    """An append-only file of JSON entries (:attr:`entries`) under a header naming the run (``identity``),
    each entry on disk before :meth:`append` returns; and a :class:`ChunkStore` beside it (:attr:`chunks`).

    ``resume``: read back the entries of the same run (another run's header is a usage error); else start
    afresh, forgetting what was there.
    """

    def __init__(self, path: str | Path, identity: dict, resume: bool):
        self.path = Path(path)
        self.chunks = ChunkStore(self.path.with_name(self.path.stem + ".chunks"))
        self.entries: list[dict] = []
        if resume:
            if not self.path.exists():
                raise UsageError(f"nothing to resume: no journal at {self.path}")
            lines = self.path.read_text().splitlines()
            header = json.loads(lines[0]) if lines else None
            if header != json.loads(json.dumps(identity)):
                raise UsageError(f"the journal at {self.path} is another run's (other cases, seed, alpha, samples or "
                                 "release): run without --resume to start afresh")
            for line in lines[1:]:
                try:
                    self.entries.append(json.loads(line))
                except json.JSONDecodeError:  # the last line of a run killed while writing it
                    continue
        else:
            self.chunks.clear()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)
            self._write(identity)

    def append(self, entry: dict) -> None:
        """Append one entry, on disk before this returns."""
        self._write(entry)
        self.entries.append(entry)

    def _write(self, entry: dict) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps(entry) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


class Journal(EntryLog):
    """The finished cases of one run (:attr:`done`, by case index), appended to ``path`` as they finish,
    and the finished chunks of its other cases (:attr:`chunks`)."""

    def __init__(self, path: str | Path, identity: dict, resume: bool):
        super().__init__(path, identity, resume)
        self.cases: list[str] = identity.get("cases", [])
        self.done: dict[int, CaseResult] = {entry["index"]: result_from_dict(entry) for entry in self.entries}

    def kept(self) -> str:
        """What a resumed run starts from, in words."""
        return (f"{len(self.done)} of {len(self.cases)} cases finished, {self.chunks.count()} finished chunks of "
                f"the others kept")

    def record(self, index: int, result: CaseResult) -> None:
        """Append one finished case, on disk before this returns; its chunks are no longer needed."""
        self._write({"index": index, **result_to_dict(result)})
        self.done[index] = result
        if len(self.done) == len(self.cases):
            self.chunks.clear()
        elif index < len(self.cases):
            self.chunks.discard(self.cases[index])


class ChunkStore:
    """Finished chunks of trials, one file each, kept by whichever process finished them.

    A chunk is named by its case's key, the case's collecting state (a case that moved to batch 1
    collects other trials: :attr:`lossless_check.modes.step_run.StepRun.state`) and its number; it is kept
    with the facts it was collected under (:meth:`~lossless_check.modes.step_run.StepRun.facts`), and read
    back only under the same facts. A file appears whole or not at all (written aside, synced, renamed),
    so a process killed while writing one leaves nothing half-written. The store holds one run's chunks:
    its :class:`Journal` checks that a resumed run is the same run, and clears it for a new one.
    Picklable: worker processes and Ray tasks on this file system keep their chunks here too.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    @staticmethod
    def _case(case_key: str) -> str:
        return hashlib.sha256(case_key.encode()).hexdigest()[:16]

    def _prefix(self, case_key: str, state) -> str:
        return f"{self._case(case_key)}-{hashlib.sha256(repr(state).encode()).hexdigest()[:8]}-"

    def _path(self, case_key: str, state, chunk: int) -> Path:
        return self.directory / f"{self._prefix(case_key, state)}{chunk}.pkl"

    def save(self, case_key: str, state, chunk: int, observations, facts) -> None:
        """Keep one finished chunk; on disk before this returns."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(case_key, state, chunk)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        with open(partial, "wb") as handle:
            pickle.dump({"key": case_key, "state": state, "chunk": chunk, "facts": facts,
                         "observations": observations}, handle, protocol=pickle.HIGHEST_PROTOCOL)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
        _sync_directory(self.directory)

    def load(self, case_key: str, state, chunk: int):
        """``(observations, facts)`` of a kept chunk, or ``None``."""
        path = self._path(case_key, state, chunk)
        try:
            with open(path, "rb") as handle:
                kept = pickle.load(handle)
        except (OSError, EOFError, pickle.UnpicklingError):
            return None
        if (kept.get("key"), kept.get("state"), kept.get("chunk")) != (case_key, state, chunk):
            return None
        return kept["observations"], kept["facts"]

    def kept(self, case_key: str, state) -> list[int]:
        """The chunks of a case (in a state) that are kept, in order."""
        prefix = self._prefix(case_key, state)
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name[len(prefix):-4]) for p in self.directory.glob(f"{prefix}*.pkl"))

    def count(self) -> int:
        """Chunks kept, of every case."""
        return len(list(self.directory.glob("*.pkl"))) if self.directory.is_dir() else 0

    def discard(self, case_key: str) -> None:
        """Forget a finished case's chunks (in every state)."""
        if self.directory.is_dir():
            for path in self.directory.glob(f"{self._case(case_key)}-*.pkl"):
                path.unlink(missing_ok=True)

    def clear(self) -> None:
        """Forget every chunk (a new run)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the platform lets a directory be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def result_to_dict(result: CaseResult) -> dict:
    """A result as a journal line's fields: its class (a mode may add fields to :class:`CaseResult`, e.g.
    :class:`~lossless_check.modes.generate.GenerateCaseResult`) and every field."""
    kind = type(result)
    return {"class": f"{kind.__module__}:{kind.__qualname__}", "result": dataclasses.asdict(result)}


def result_from_dict(entry: dict) -> CaseResult:
    """The result :func:`result_to_dict` wrote, of its own class."""
    import importlib

    from lossless_check.evidence.results import CaseResult

    module, _, name = entry.get("class", "lossless_check.evidence.results:CaseResult").partition(":")
    kind = getattr(importlib.import_module(module), name) if module.startswith("lossless_check.") else None
    if not (isinstance(kind, type) and issubclass(kind, CaseResult)):
        raise ValueError(f"a journal entry names {entry['class']}, which is no CaseResult")
    fields = dict(entry["result"])
    if fields.get("tv_ci") is not None:
        fields["tv_ci"] = tuple(fields["tv_ci"])
    return kind(**fields)


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never half of one.
    Missing parent directories are made (as pytest's ``--junitxml`` does)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def check_writable_file(path: str, option: str) -> None:
    """Raise :class:`UsageError` unless a file can be written at ``path``, its missing parent
    directories made (before any work: only an unwritable path is refused)."""
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    _check_creatable(target.parent, f"{option} {path}")


def check_writable_dir(path: str, option: str) -> None:
    """Raise :class:`UsageError` unless ``path`` is, or can be made, a writable directory."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{option} {path}: exists and is not a directory")
    _check_creatable(target, f"{option} {path}")


def _check_creatable(directory: Path, what: str) -> None:
    """``directory`` exists and is writable, or its nearest existing ancestor is a writable directory
    (where the missing ones will be made)."""
    existing = directory if str(directory) else Path(".")
    while not existing.exists():
        existing = existing.parent
    _check_writable_dir(existing, what)


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
