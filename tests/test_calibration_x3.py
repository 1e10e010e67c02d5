"""False-failure rates of the L1, likelihood-ratio and verdict tests on stratified null data whose
stratum sizes are random and depend on acceptance, with a check strong enough to fail a test whose
true false-failure rate is three times its nominal alpha.

The data are a simulated speculative round (:class:`calibration_checks.NullRound`): 20 to 250 trials
per round, the law of each token chosen by the two tokens before it, and a row reaching the next
position with a probability that depends on its token (acceptance). Position 1 is one stratum of a
random size; positions 2 and 3 hold up to 6 and 36 strata whose sizes depend on the earlier tokens
and on acceptance. The strata are built by :func:`lossless_check.evidence.analysis.strata`, as the engine
builds them. Each test's guarantee holds given the stratum sizes, so it must hold here.

The check (:func:`null_check`): per test, position and nominal alpha (18 rows), a one-sided exact
binomial test of "false-failure rate <= alpha" at level ``1e-4 / 18``, so a correct implementation
fails it with probability at most 1e-4. The check sees only how often a test rejects; its power
against any test whose true rate is ``3 alpha`` is computed in the tests (at least 0.9999 per row).
The tests are conservative (their measured rates are a fraction of alpha), which is allowed: the
check can only fail a rate above alpha.
"""

from __future__ import annotations

import numpy as np

from calibration_checks import NullRound, check_power, rate_check
from lossless_check.evidence.analysis import strata
from lossless_check.stats import verdict_test

#: The chance that one check of this module fails a correct implementation.
CHECK_ERROR_RATE = 1e-4
ROUND = NullRound(vocab=6, depth=3, seed=0)
TESTS = ("l1", "lr", "verdict")
ALPHAS = (0.05, 0.2)
RUNS = 600
LEVEL = CHECK_ERROR_RATE / (len(TESTS) * ROUND.depth * len(ALPHAS))


def round_strata(rows: np.ndarray) -> list[list]:
    """The strata of every position of one round, as the engine builds them (rows that reached it)."""
    return [strata(rows[rows[:, j] >= 0], j, ROUND.law_of, ROUND.vocab) for j in range(ROUND.depth)]


def null_pvalues(runs: int, seed: int) -> dict[str, np.ndarray]:
    """``(runs, positions)`` p-values of each test on null rounds. The verdict's components are the
    L1 test (:func:`~lossless_check.stats.law_test`) and the likelihood-ratio test
    (:func:`~lossless_check.stats.lr_test`) themselves; their p-values do not depend on alpha."""
    rng = np.random.default_rng(seed)
    out = {name: np.ones((runs, ROUND.depth)) for name in TESTS}
    for r in range(runs):
        for j, position in enumerate(round_strata(ROUND.draw(rng, int(rng.integers(20, 251))))):
            result = verdict_test(position, 0.1)
            assert result.support_violations == 0
            out["l1"][r, j], out["lr"][r, j], out["verdict"][r, j] = result.l1_pvalue, result.lr_pvalue, result.pvalue
    return out


def null_check(pvalues: dict[str, np.ndarray]) -> list[dict]:
    """One row per test, position and alpha: :func:`calibration_checks.rate_check` of the share of runs
    with ``p <= alpha`` against ``alpha`` at :data:`LEVEL`."""
    rows = []
    for name, p in pvalues.items():
        for j in range(p.shape[1]):
            for alpha in ALPHAS:
                row = rate_check(int((p[:, j] <= alpha).sum()), len(p), alpha, LEVEL)
                rows.append({"test": name, "position": j + 1, **row})
    return rows


def test_the_null_rounds_have_random_acceptance_dependent_strata():
    """The data are what the checks claim: the number of rows reaching positions 2 and 3 and the
    stratum sizes vary between rounds, and a row's chance to go on depends on its token."""
    rng = np.random.default_rng(1)
    sizes = [[sorted(s.n for s in position) for position in round_strata(ROUND.draw(rng, 200))] for _ in range(5)]
    for j in (1, 2):
        assert len({tuple(s[j]) for s in sizes}) == 5 and max(len(s[j]) for s in sizes) > 3
    rows = ROUND.draw(rng, 20_000)
    reach = [(rows[rows[:, 0] == x, 1] >= 0).mean() for x in range(ROUND.vocab)]
    assert reach[0] > 0.85 and reach[-1] < 0.25


def test_null_rates_are_within_alpha_and_each_test_miscalibrated_x3_fails():
    """600 null rounds, 3 positions, alpha 0.05 and 0.2: every test's false-failure rate passes the
    one-sided binomial check. False-failure rate of this check: <= 1e-4. Power: a test whose true
    rate is 3 alpha fails a row with probability >= 0.9999 (0.15 at 0.05, 0.6 at 0.2).

    Then each test made to reject three times as often as alpha allows fails every row of the same
    check. The broken variant's p-value is ``min(p, U / 3)``, ``U`` uniform and independent: it rejects
    at ``alpha`` with probability at least ``3 alpha``, at every alpha (the check sees only rejections,
    so any test with that rate is as detectable). The chance that some of its 18 rows pass is below
    ``18 * 1e-4``. (One process computes the p-values once for both halves: under pytest-xdist a
    module fixture would be computed again by each worker.)"""
    pvalues = null_pvalues(RUNS, seed=24)
    rows = null_check(pvalues)
    assert not [row for row in rows if row["fails"]], rows
    for alpha in ALPHAS:
        assert check_power(RUNS, alpha, LEVEL, 3 * alpha) >= 0.9999

    u = np.random.default_rng(3).random((RUNS, ROUND.depth)) / 3
    for name in TESTS:
        rows = null_check({name: np.minimum(pvalues[name], u)})
        assert all(row["fails"] for row in rows), (name, rows)


def test_an_l1_tail_bound_three_times_too_small_fails_where_the_bound_is_exact():
    """A realistic x3 bug: the L1 p-value divided by 3 (a tail bound three times too small). On one
    stratum of two tokens the ``subsets`` bound is the exact two-sided binomial tail, so there the L1
    test is nearly exact and the bug shows: with n = 500 draws of the law (0.3, 0.7), every count
    vector enumerated, the exact false-failure rates are 0.0875 (correct) and 0.262 (broken) at alpha
    0.1, 0.188 and 0.591 at alpha 0.2. The null check (600 draws, one-sided binomial test of "rate <=
    alpha" at 1e-4 / 2 per alpha) passes the correct test (error <= 1e-4) and fails the broken one
    at both alphas (power >= 0.9999 at the exact broken rates, computed below)."""
    from scipy import stats as sps

    from lossless_check.stats import Stratum, law_test

    n, law, runs, alphas, level = 500, np.array([0.3, 0.7]), 600, (0.1, 0.2), 1e-4 / 2
    first = np.arange(n + 1)
    pvalue = np.array([law_test([Stratum(np.array([c, n - c]), law)], 0.1).pvalue for c in first])
    pmf = sps.binom.pmf(first, n, law[0])
    draws = np.random.default_rng(7).binomial(n, law[0], size=runs)
    for alpha in alphas:
        assert pmf[pvalue <= alpha].sum() <= alpha
        assert not rate_check(int((pvalue[draws] <= alpha).sum()), runs, alpha, level)["fails"]
        broken_rate = float(pmf[pvalue / 3 <= alpha].sum())
        assert broken_rate > 2.5 * alpha and check_power(runs, alpha, level, broken_rate) >= 0.9999
        assert rate_check(int((pvalue[draws] / 3 <= alpha).sum()), runs, alpha, level)["fails"]
