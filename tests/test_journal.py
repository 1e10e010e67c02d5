"""The journal keeps every field of every mode's result: a resumed run reads back what the run wrote."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lossless_check.faces.api import cases_for, run_cases
from lossless_check.running.journal import Journal, run_identity
from lossless_check.modes import MODES
from lossless_check.outputs.report import _clean


@pytest.mark.parametrize("mode", MODES)
def test_every_modes_result_round_trips_through_the_journal(tmp_path, mode):
    cases = cases_for(["AssistedCandidateGenerator"], "top_k=3", None, mode, "iid8")
    results = run_cases(cases, 250, 1e-6, 0).cases
    identity = run_identity(cases, 250, 1e-6, 0, True, None)
    journal = Journal(tmp_path / "j.jsonl", identity, resume=False)
    for index, result in enumerate(results):
        journal.record(index, result)
    back = Journal(tmp_path / "j.jsonl", identity, resume=True).done
    assert sorted(back) == list(range(len(results)))
    for index, result in enumerate(results):
        assert type(back[index]) is type(result)
        # Every field, as the report writes it (a tuple inside a field reads back as a list).
        assert _clean(dataclasses.asdict(back[index])) == json.loads(json.dumps(_clean(dataclasses.asdict(result))))
        assert back[index].explain() == result.explain()
    assert any(type(r).__name__ != "CaseResult" for r in results) == (mode in ("generate", "all"))


def test_a_journal_entry_names_only_the_librarys_result_classes():
    from lossless_check.running.journal import result_from_dict

    with pytest.raises(ValueError):
        result_from_dict({"class": "os:system", "result": {}})


def test_an_entry_log_reads_back_its_own_runs_entries_only(tmp_path):
    from lossless_check.core.errors import UsageError
    from lossless_check.running.journal import EntryLog

    log = EntryLog(tmp_path / "j.jsonl", {"seed": 0}, resume=False)
    log.chunks.save("case", None, 0, [1], None)
    log.append({"stack": "top_k=3"})
    with open(log.path, "a") as handle:
        handle.write('{"stack": "half a li')  # the line a SIGKILL cut
    again = EntryLog(tmp_path / "j.jsonl", {"seed": 0}, resume=True)
    assert again.entries == [{"stack": "top_k=3"}] and again.chunks.count() == 1
    with pytest.raises(UsageError, match="another run's"):
        EntryLog(tmp_path / "j.jsonl", {"seed": 1}, resume=True)
    with pytest.raises(UsageError, match="nothing to resume"):
        EntryLog(tmp_path / "none.jsonl", {"seed": 0}, resume=True)
    fresh = EntryLog(tmp_path / "j.jsonl", {"seed": 1}, resume=False)  # a new run forgets the old one's work
    assert fresh.entries == [] and fresh.chunks.count() == 0
