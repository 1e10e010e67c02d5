"""End-to-end null checks of the wiring between the statistics and the verdict: stratification,
coarsening above V = 4096, the Bonferroni split over positions and Holm across cases. Each check is
run on the real code and on a deliberately broken variant patched in, which it must fail.

Every check is :func:`family_null_check`: many null runs (numpy draws from the exact laws, no
harness), each through :func:`~lossless_check.evidence.analysis.strata`,
:func:`~lossless_check.evidence.analysis.position_tests` and :func:`~lossless_check.evidence.results.decide` as the
engine calls them, and a one-sided exact binomial test of "family-wise false-failure rate <= alpha"
at level 1e-4 (the chance it fails a correct implementation). Its power against each broken variant
is stated beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from calibration_checks import NullRound, check_power, rate_check
from lossless_check.evidence import analysis
from lossless_check.evidence.results import CaseResult, decide
from lossless_check.stats import verdict_test

#: The chance that one check of this module fails a correct implementation.
CHECK_ERROR_RATE = 1e-4
ALPHA = 0.2


def family_null_check(run_once: Callable[[np.random.Generator], bool], runs: int, seed: int) -> dict:
    """``run_once(rng)`` is one null run (True: some case was declared not lossless); the row fails
    when the one-sided binomial test rejects "rate <= ALPHA" at :data:`CHECK_ERROR_RATE`."""
    rng = np.random.default_rng(seed)
    return rate_check(sum(bool(run_once(rng)) for _ in range(runs)), runs, ALPHA, CHECK_ERROR_RATE)


def family_rejects(strata_by_case: list[list[list]]) -> bool:
    """The verdict of a family of cases (one list of position strata each), at family rate ALPHA: each
    case's alpha is ALPHA over the cases, as :func:`lossless_check.faces.api.run_cases` splits it."""
    results = []
    for by_position in strata_by_case:
        result = CaseResult("g", "", "step", "s")
        analysis.position_tests(result, by_position, ALPHA / len(strata_by_case))
        results.append(result)
    decide(results, ALPHA)
    return any(r.verdict == "not_lossless" for r in results)


# --------------------------------------------------------------------------------------------------
# Stratification

ROUND = NullRound(vocab=6, depth=3, seed=2, concentration=0.5)


def round_strata(rng: np.random.Generator) -> list[list]:
    rows = ROUND.draw(rng, int(rng.integers(200, 401)))
    return [analysis.strata(rows[rows[:, j] >= 0], j, ROUND.law_of, ROUND.vocab) for j in range(ROUND.depth)]


def test_stratification_passes_the_null_check_and_a_pooling_one_fails_it(monkeypatch):
    """Null rounds (200 to 400 trials, strata at position 3 chosen by the two tokens before it, sizes
    depending on acceptance), real verdict, one case at alpha 0.2, 80 runs: the rate passes (error
    <= 1e-4; measured 1 rejection in 100 runs).

    Broken variant: rows whose prefixes end in the same token pooled into one stratum under the law of
    the first such prefix (strata with different laws pooled). Measured rejection rate 0.96 (200 runs);
    the check's power against any rate >= 0.6 is >= 0.9999."""
    runs = 80
    assert not family_null_check(lambda rng: family_rejects([round_strata(rng)]), runs, seed=1)["fails"]

    real = analysis.stratify

    def pooled_by_last_token(rows, position, law_of):
        first = {}
        return real(rows, position, lambda prefix: law_of(first.setdefault(prefix[-1:], prefix)))

    monkeypatch.setattr(analysis, "stratify", pooled_by_last_token)
    assert family_null_check(lambda rng: family_rejects([round_strata(rng)]), runs, seed=1)["fails"]
    assert check_power(runs, ALPHA, CHECK_ERROR_RATE, 0.6) >= 0.9999


# --------------------------------------------------------------------------------------------------
# Coarsening above V = 4096

BIG_VOCAB = 5000


def _zipf(seed: int) -> np.ndarray:
    law = np.random.default_rng(seed).permutation(1.0 / np.arange(1, BIG_VOCAB + 1) ** 1.1)
    return law / law.sum()


BIG_LAWS = [_zipf(1), _zipf(2), _zipf(3)]


def big_law_of(prefix: tuple) -> np.ndarray:
    """Position 1: one law; position 2: one of two laws, by the parity of the first token."""
    return BIG_LAWS[0] if not prefix else BIG_LAWS[1 + prefix[0] % 2]


def big_vocab_strata(rng: np.random.Generator) -> list[list]:
    """100 to 300 trials; a row reaches position 2 with probability 0.8 if its first token is one of the
    50 likeliest, else 0.3 (acceptance-dependent stratum sizes)."""
    trials = int(rng.integers(100, 301))
    first = rng.choice(BIG_VOCAB, trials, p=BIG_LAWS[0])
    likely = np.isin(first, np.argsort(-BIG_LAWS[0])[:50])
    second = np.where(first % 2, rng.choice(BIG_VOCAB, trials, p=BIG_LAWS[2]), rng.choice(BIG_VOCAB, trials, p=BIG_LAWS[1]))
    rows = np.column_stack([first, np.where(rng.random(trials) < np.where(likely, 0.8, 0.3), second, -1)])
    return [analysis.strata(rows[rows[:, j] >= 0], j, big_law_of, BIG_VOCAB) for j in range(2)]


def by_observed_counts(ids, tokens, laws, vocab):
    """Broken coarsening: the top cells are the most *observed* tokens of each stratum (data-dependent
    cells), the rest as :func:`~lossless_check.evidence.analysis.coarsening` buckets them."""
    cells, cell_laws, within = np.zeros(len(tokens), dtype=np.int64), [], []
    for s, law in enumerate(laws):
        here = ids == s
        counts = np.bincount(tokens[here], minlength=len(law))
        cell_of, _ = analysis.coarsening(np.where(counts > 0, 1.0 + counts, 0.0) + law)  # seen tokens first
        cells[here] = cell_of[tokens[here]]
        cell_laws.append(np.bincount(cell_of, weights=law, minlength=analysis.COARSE_CELLS))
        within.append(analysis.within_cell_tv(law, cell_of))
    return cells, cell_laws, analysis.COARSE_CELLS, within


def test_coarsening_passes_the_null_check_and_data_dependent_cells_fail_it(monkeypatch):
    """V = 5000 (coarsened to 81 cells), two positions, null draws, real verdict, alpha 0.2: the rate
    passes (error <= 1e-4). Broken variant: the partition's top cells picked by the observed counts
    (seen tokens first), a partition that depends on the data: it fails (measured: 300 of 300 runs
    rejected); the check's power against any rate >= 0.6 is >= 0.9999."""
    runs = 80
    assert analysis.tested_cells(BIG_VOCAB) == analysis.COARSE_CELLS
    assert all(len(s.expected) == analysis.COARSE_CELLS for p in big_vocab_strata(np.random.default_rng(0)) for s in p)
    assert not family_null_check(lambda rng: family_rejects([big_vocab_strata(rng)]), runs, seed=2)["fails"]
    monkeypatch.setattr(analysis, "coarsened", by_observed_counts)
    assert family_null_check(lambda rng: family_rejects([big_vocab_strata(rng)]), runs, seed=2)["fails"]
    assert check_power(runs, ALPHA, CHECK_ERROR_RATE, 0.6) >= 0.9999


# --------------------------------------------------------------------------------------------------
# Bonferroni over positions, Holm across cases

CASES, POSITIONS = 4, 3


def exactly_calibrated(rng: np.random.Generator, template) -> Callable:
    """A stand-in for :func:`~lossless_check.stats.verdict_test` whose p-value is uniform and independent
    under the null: the least conservative valid test, so that a lost correction shows in the rate."""
    return lambda strata, alpha, power: dataclasses.replace(template, pvalue=float(rng.random()))


def corrections_null_check(monkeypatch, runs: int = 600, seed: int = 3) -> dict:
    """Family-wise null check of 4 cases of 3 positions each, every position's test exactly calibrated
    (:func:`exactly_calibrated`): the verdicts go through ``position_tests`` (Bonferroni over positions) and
    ``decide`` (Holm across cases). Correct wiring: family rate ``1 - (1 - 0.2 / 12)^12 = 0.182``,
    within 0.2."""
    by_position = round_strata(np.random.default_rng(0))
    strata_by_case = [by_position] * CASES
    template = verdict_test(by_position[0], ALPHA)

    def run_once(rng):
        monkeypatch.setattr(analysis, "verdict_test", exactly_calibrated(rng, template))
        return family_rejects(strata_by_case)

    return family_null_check(run_once, runs, seed)


def test_bonferroni_and_holm_pass_the_family_null_check_and_dropping_either_fails_it(monkeypatch):
    """600 runs of the family (4 cases x 3 positions, exactly calibrated position tests, alpha 0.2):
    the correct wiring's rate is 0.182 and passes (error <= 1e-4). Broken variants, each caught:

    - no Holm (each case's p-value compared with alpha): rate ``1 - (1 - 0.2/3)^12 = 0.56``;
    - no Bonferroni over positions (a case's p-value is its smallest): rate ``1 - (1 - 0.2/4)^12 = 0.46``.

    The check's power against any rate >= 0.4 is >= 0.9999 (computed below)."""
    assert not corrections_null_check(monkeypatch)["fails"]
    assert check_power(600, ALPHA, CHECK_ERROR_RATE, 0.4) >= 0.9999
    with monkeypatch.context() as patch:
        patch.setattr("lossless_check.evidence.results.holm_correction", lambda p: np.asarray(p, dtype=float))
        assert corrections_null_check(patch)["fails"]
    with monkeypatch.context() as patch:
        patch.setattr(analysis, "bonferroni_min", lambda p: float(min(p)))
        assert corrections_null_check(patch)["fails"]
