"""A case split across workers gives the unsplit run's result: same verdicts, sample counts, p-values.

The split is forced (every case splits, however small) so that the cases stay quick; what it
covers: a clean case that runs to the end, a bug caught at an early look, a case whose batched rows
differ from their batch-1 replays (it starts again at batch 1, in the driver and the workers alike),
and a case built under per-process facts (a fast tokenizer's vocabulary order), which runs whole.
"""

from __future__ import annotations

import dataclasses

import pytest

from lossless_check.running import scheduler
from lossless_check.faces.api import cases_for, run_cases
from lossless_check.running.scheduler import MIN_SPLIT_SECONDS, should_split
from fixtures.releases import DFLASH, assisted_samples, needs

GENERATORS = ["DFlashTokenCandidateGenerator", "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits",
              "fixtures.mutants.dflash_greedy_at_batch_1:DFlashGreedyAtBatch1"]
#: What two runs of the same cases may differ in: the time they took.
TIMINGS = ("seconds", "samples_per_second")


def rows(result) -> list[dict]:
    return [{k: v for k, v in dataclasses.asdict(c).items() if k not in TIMINGS} for c in result.cases]


def watch_splits(monkeypatch) -> tuple[list[int], list[int]]:
    """Force every case to split; return the lists the run fills: the indices of the cases split, and of
    those that then ran whole (a chunk came from another process's facts)."""
    split, ran_whole = [], []
    original, real_fetch = scheduler.SplitCase.__init__, scheduler.SplitCase.fetch

    def counted(self, index, *args, **kwargs):
        split.append(index)
        original(self, index, *args, **kwargs)

    def fetch(self, *args):
        try:
            return real_fetch(self, *args)
        except scheduler._NotSplittable:
            ran_whole.append(self.index)
            raise

    monkeypatch.setattr(scheduler.SplitCase, "__init__", counted)
    monkeypatch.setattr(scheduler.SplitCase, "fetch", fetch)
    monkeypatch.setattr(scheduler, "should_split", lambda *args: True)
    return split, ran_whole


def test_a_case_splits_only_where_workers_would_idle():
    big = 4 * MIN_SPLIT_SECONDS
    assert not should_split(big, big, 1, slots=1)  # one worker: nothing to share
    assert not should_split(MIN_SPLIT_SECONDS / 2, MIN_SPLIT_SECONDS / 2, 1, slots=2)  # too small to pay
    assert should_split(big, big, 1, slots=2)  # a run of one case
    assert should_split(big, big + 1, 2, slots=4)  # the run's tail: fewer cases than workers
    assert not should_split(big, 100 * big, 50, slots=2)  # many cases keep every worker busy
    assert should_split(big, big + 3.0, 4, slots=2)  # it would end the run alone


@needs(DFLASH)
def test_split_cases_give_the_unsplit_runs_json(monkeypatch):
    cases = cases_for(GENERATORS, ["top_k=3"], None, "step", "iid8")
    # Its own family: its p-value depends on the order its process drew, and Holm's adjustment of
    # the other cases on its p-value.
    fast = cases_for(["UniversalSpeculativeDecodingGenerator"], ["top_k=3"], None, "step", "iid32-fast-tokenizers")
    whole = run_cases(cases, 1500, 1e-6, 0, workers=1)
    split, ran_whole = watch_splits(monkeypatch)
    on_two = run_cases(cases, 1500, 1e-6, 0, workers=2)
    assert sorted(set(split)) == [0, 1, 2]
    before = rows(whole)
    assert before == rows(on_two)
    assert [r["verdict"] for r in before] == ["lossless", "not_lossless", "not_lossless"]
    assert before[2]["batch"]["note"].startswith("batch 1: row ")  # started again at batch 1
    assert before[1]["samples"] < 1500  # stopped at an early look

    split.clear()
    [result] = run_cases(fast, 1500, 1e-6, 0, workers=2).cases
    assert split == [0] and ran_whole == [0]  # its chunks came from other processes' vocabulary orders
    # Which verdict depends on the vocabulary orders its processes drew (the finding): asserted is where the
    # chunks came from, and that the case ran to a verdict with that fact recorded.
    assert result.verdict not in ("error", "skipped") and result.generator_facts["vocabulary_order"], result.reason


def test_a_chunks_trials_do_not_depend_on_the_chunks_collected_before():
    """What splitting rests on: chunk 2 collected in a fresh process equals chunk 2 after chunks 0 and 1."""
    import numpy as np

    from lossless_check.running.chunks import chunk_plan
    from lossless_check.modes.step_run import StepRun

    [case] = cases_for(["AssistedCandidateGenerator"], ["top_k=3"], None, "step", "markov8")
    seen = StepRun(case, 1000, 0, 1e-6)
    parts = [seen.collect_here(c, *chunk_plan(case, 1000, 0, c)) for c in range(3)]
    fresh = StepRun(case, 1000, 0, 1e-6).collect_here(2, *chunk_plan(case, 1000, 0, 2))
    assert np.array_equal(parts[2].emitted, fresh.emitted) and np.array_equal(parts[2].n_matches, fresh.n_matches)


@assisted_samples()
def test_a_generator_managing_its_own_randomness_runs_whole(monkeypatch):
    """Its trials come from its own stream, not from the chunk seeds (two processes may draw the same
    private stream): once the watch sees it, chunks collected in other processes are not the case's, and
    it runs whole, its reason saying so. Control: the built-in Assisted beside it splits and keeps its chunks."""
    from lossless_check.modes.randomness import OWN_RANDOMNESS

    cases = cases_for(["fixtures.mutants.private_randomness:PrivateGenerator", "AssistedCandidateGenerator"],
                      ["top_k=3"], None, "step", "markov8")
    split, ran_whole = watch_splits(monkeypatch)
    private, builtin = run_cases(cases, 1000, 1e-6, 0, workers=2).cases
    assert sorted(set(split)) == [0, 1] and set(ran_whole) == {0}
    assert OWN_RANDOMNESS in private.batch["note"] and private.batch["batch_size"] == 1
    assert builtin.verdict == "lossless" and OWN_RANDOMNESS not in builtin.batch["note"]


@assisted_samples()
@pytest.mark.parametrize("drafter, control", [
    ("ProcessStream", "AssistedCandidateGenerator"),
    # A numpy Generator built at import is seen by its drafts alone; numpy's global stream, seeded per chunk, is fine.
    ("ProcessNumpyStream", "fixtures.mutants.private_randomness:NumpyDraftLength")])
def test_a_batch_1_generator_managing_its_own_randomness_runs_whole(monkeypatch, drafter, control):
    """Batch-1 trials (the real loop's calls) are watched too: a drafter drawing from one private stream
    per process (seeded at import: two workers draw the same stream) runs whole, its reason saying why.
    Control: a generator drawing from global streams beside it, at batch 1 too, splits."""
    from lossless_check.modes.randomness import OWN_RANDOMNESS

    cases = cases_for([f"fixtures.mutants.private_randomness:{drafter}", control], ["top_k=3"], None, "step",
                      "markov8")
    split, ran_whole = watch_splits(monkeypatch)
    private, builtin = run_cases(cases, 1000, 1e-6, 0, workers=2, batch_size=1).cases
    assert sorted(set(split)) == [0, 1] and set(ran_whole) == {0}
    assert private.verdict == "lossless" and OWN_RANDOMNESS in private.batch["note"], private.batch
    assert private.batch["batch_size"] == 1
    assert builtin.verdict == "lossless" and OWN_RANDOMNESS not in builtin.batch["note"], builtin.batch


def test_a_chunk_drawing_from_numpys_global_stream_is_a_function_of_its_seed():
    """Numpy's and Python's global streams are seeded with each chunk's seed, as torch's is: a drafter
    drawing its draft length from numpy's stream (lossless) collects the same chunk whatever was drawn
    before (without the seeding: the draft lengths follow numpy's state, and the chunks differ)."""
    import numpy as np

    from lossless_check.modes.step_run import StepRun
    from lossless_check.running.chunks import chunk_plan

    [case] = cases_for(["fixtures.mutants.private_randomness:NumpyDraftLength"], ["top_k=3"], None, "step",
                       "markov8")
    first = StepRun(case, 1000, 0, 1e-6, batch_size=1).collect_here(1, *chunk_plan(case, 1000, 0, 1))
    np.random.seed(7)
    again = StepRun(case, 1000, 0, 1e-6, batch_size=1).collect_here(1, *chunk_plan(case, 1000, 0, 1))
    assert len(set(first.drafts.tolist())) == 3  # 1 to 3 tokens: its trials do depend on numpy's draws
    assert np.array_equal(first.emitted, again.emitted) and np.array_equal(first.drafts, again.drafts)
