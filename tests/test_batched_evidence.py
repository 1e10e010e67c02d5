"""Batched evidence without loopholes (issue 39): what a batched step case may conclude, and what it states.

- Batched rows never fail a case: a generator that is exactly the built-in at batch 1 but wrong in
  batched calls only (``fixtures/mutants/batched_only_defect.py``) is never ``not_lossless``.
"""

from __future__ import annotations

from collections import Counter

from lossless_check.api import cases_for, run_cases

#: The batched-only defect's runs. 500 trials still show it: before the fix every run below was
#: ``not_lossless`` (impossible_draft, measured 6 of 6), at 5,000 trials 34 of 40.
DEFECT_RUNS, DEFECT_SAMPLES = 40, 500


def test_a_defect_of_batched_calls_only_never_fails_the_case():
    [case] = cases_for(["fixtures.mutants.batched_only_defect:ImpossibleDraftWhenBatched"], [""], None, "step",
                       "markov8", 4)
    results = [run_cases([case], DEFECT_SAMPLES, 1e-6, seed).cases[0] for seed in range(DEFECT_RUNS)]
    verdicts = Counter(r.verdict for r in results)
    assert verdicts == {"lossless": DEFECT_RUNS}, verdicts
    # The defect showed (the batched rows had an impossible draft, or a replay saw the row differ) in
    # most runs (measured: 38 of 40), and each such case moved to batch 1 and says why.
    moved = [r.batch["note"] for r in results if r.batch["batch_size"] == 1]
    assert len(moved) >= DEFECT_RUNS * 3 // 4, moved
    assert all(n.startswith("batch 1: ") for n in moved) and any("impossible_draft" in n for n in moved), moved
