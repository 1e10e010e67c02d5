"""The statistics engine: validity of its p-values and the power it claims, measured."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from lossless_check.stats import (
    Stratum,
    detectable_tv,
    holm_correction,
    law_test,
    mixture_log_evalues,
    samples_for_tv,
    tv_confidence_interval,
)

P = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])


def _shifted(p, tv):
    """A law at exactly ``tv`` from ``p``: move ``tv`` of mass from the largest to the smallest cell."""
    q = p.copy()
    q[np.argmax(p)] -= tv
    q[np.argmin(p)] += tv
    return q


def test_null_false_failure_rate_is_within_its_bound():
    """Many null samples at a loose alpha: the observed rejection rate stays within alpha (binomial bound)."""
    rng = np.random.default_rng(12345)
    alpha, runs = 0.05, 2000
    rejections = sum(law_test([Stratum(rng.multinomial(500, P), P)], alpha).rejects(alpha) for _ in range(runs))
    upper = sps.binomtest(rejections, runs).proportion_ci(0.999).high
    assert rejections / runs <= alpha and upper >= 0  # the bound holds outright (the test is conservative)


def test_stratified_null_is_valid_too():
    rng = np.random.default_rng(7)
    laws = [P, P[::-1].copy(), np.full(8, 1 / 8)]
    alpha, runs = 0.1, 1000
    rejections = 0
    for _ in range(runs):
        strata = [Stratum(rng.multinomial(n, law), law) for n, law in zip((300, 120, 40), laws)]
        rejections += law_test(strata, alpha).rejects(alpha)
    assert rejections / runs <= alpha


@pytest.mark.parametrize("n", [2_000, 20_000])
def test_power_is_at_least_what_is_claimed(n):
    """At the claimed detectable TV, the test rejects in at least 99% of runs."""
    rng = np.random.default_rng(n)
    alpha = 1e-6
    tv = detectable_tv([n], len(P), [P], alpha)
    alt = _shifted(P, min(tv, P.min() + 0.28))
    assert 0.5 * np.abs(alt - P).sum() == pytest.approx(tv, rel=1e-9) or tv > 0.28
    runs = 300
    hits = sum(law_test([Stratum(rng.multinomial(n, alt), P)], alpha).rejects(alpha) for _ in range(runs))
    assert hits / runs >= 0.99


def test_negative_control_is_rejected_and_identical_law_is_not():
    rng = np.random.default_rng(0)
    bad = law_test([Stratum(rng.multinomial(20_000, _shifted(P, 0.09)), P)], 1e-6)
    assert bad.rejects(1e-6) and bad.pvalue < 1e-20
    good = law_test([Stratum(np.round(P * 20_000).astype(int), P)], 1e-6)
    assert not good.rejects(1e-6) and good.statistic < 1e-3


def test_support_violation_is_an_exact_failure():
    p = np.array([0.5, 0.5, 0.0])
    result = law_test([Stratum(np.array([500, 499, 1]), p)], 1e-12)
    assert result.support_violations == 1 and result.rejects(1e-300)


def test_samples_for_tv_inverts_detectable_tv():
    n = samples_for_tv(0.05, 8, 1e-6)
    assert detectable_tv([n], 8, None, 1e-6) <= 0.05 < detectable_tv([int(n * 0.95)], 8, None, 1e-6)


def test_tv_interval_covers_the_truth():
    rng = np.random.default_rng(3)
    alt = _shifted(P, 0.05)
    misses = 0
    for _ in range(300):
        low, high = tv_confidence_interval([Stratum(rng.multinomial(3000, alt), P)], 0.95)
        misses += not (low <= 0.05 <= high)
    assert misses / 300 <= 0.05


def test_holm_matches_its_definition():
    adjusted = holm_correction([0.01, 0.04, 0.03, 0.5])
    assert adjusted.tolist() == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm_correction([]).size == 0


@settings(max_examples=50, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=12),
    n=st.integers(1, 5000),
    alpha=st.floats(1e-9, 0.5),
)
def test_exact_expected_counts_never_fail(weights, n, alpha):
    """Counts that match the law as closely as integers allow never fail, at any alpha."""
    p = np.asarray(weights) / np.sum(weights)
    counts = np.floor(p * n).astype(int)
    counts[np.argmax(p - counts / max(n, 1))] += n - counts.sum()
    assert not law_test([Stratum(counts, p)], alpha).rejects(alpha)


@settings(max_examples=30, deadline=None)
@given(weights=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=10), seed=st.integers(0, 2**32 - 1))
def test_pvalues_are_in_range_and_statistic_is_a_tv(weights, seed):
    p = np.asarray(weights) / np.sum(weights)
    counts = np.random.default_rng(seed).multinomial(200, p)
    result = law_test([Stratum(counts, p)], 0.01)
    assert 0 <= result.pvalue <= 1 and 0 <= result.statistic <= 1


def test_all_samples_outside_the_support_is_a_clean_exact_failure():
    result = law_test([Stratum(np.array([0, 0, 7]), np.array([0.5, 0.5, 0.0]))], 1e-6)
    assert result.support_violations == 7 and result.chi2 is None


def test_anytime_evalue_keeps_its_level_over_the_whole_stream():
    """Ville's inequality, measured: null streams of 400 two-strata observations, watched after every
    observation, cross 1/alpha in at most an alpha share of runs (one-sided binomial test of that
    claim, false-failure rate 1e-3)."""
    rng = np.random.default_rng(2024)
    laws = [P, np.full(8, 1 / 8)]
    cdfs = np.cumsum(laws, axis=1)
    alpha, runs, crossings = 0.1, 1500, 0
    for _ in range(runs):
        strata = rng.integers(0, 2, 400)
        tokens = np.minimum((rng.random(400)[:, None] > cdfs[strata]).sum(axis=1), 7)
        crossings += mixture_log_evalues(strata, tokens, laws).max() >= np.log(1 / alpha)
    assert sps.binomtest(int(crossings), runs, alpha, alternative="greater").pvalue > 1e-3


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**32 - 1))
def test_anytime_evalue_is_the_kt_mixture_and_within_its_regret_of_the_best_alternative(n, seed):
    """The running e-value is exactly the Krichevsky-Trofimov mixture likelihood ratio, so after any
    n draws its log is at least n KL(empirical || p) minus the KT regret
    (K - 1)/2 log n + log(Gamma(1/2)^K / Gamma(K/2)): the power the sequential runner relies on."""
    from scipy.special import gammaln

    rng = np.random.default_rng(seed)
    tokens = rng.choice(8, n, p=rng.dirichlet(np.full(8, 0.5)))
    log_e = mixture_log_evalues(np.zeros(n, dtype=int), tokens, [P])[-1]
    counts = np.bincount(tokens, minlength=8)
    k = len(P)
    log_kt = gammaln(k / 2) - k * gammaln(0.5) + gammaln(counts + 0.5).sum() - gammaln(n + k / 2)
    assert log_e == pytest.approx(log_kt - np.sum(counts * np.log(P)), rel=1e-9, abs=1e-9)
    seen = counts > 0
    best = np.sum(counts[seen] * np.log(counts[seen] / n / P[seen]))  # n KL(empirical || p)
    assert log_e >= best - ((k - 1) / 2 * np.log(n) + k * gammaln(0.5) - gammaln(k / 2))


def test_anytime_evalue_ignores_tokens_outside_the_support():
    """Those are exact failures, checked elsewhere; they must not break the martingale."""
    law = np.array([0.5, 0.5, 0.0])
    log_e = mixture_log_evalues(np.zeros(3, dtype=int), np.array([0, 2, 1]), [law])
    assert np.isfinite(log_e).all() and log_e[1] == log_e[0]
