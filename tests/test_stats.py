"""The statistics engine: validity of its p-values and the power it claims, measured."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from scipy.special import gammaln

from lossless_check.stats import (
    L1_BOUNDS,
    L1_BOUNDS_LEGACY,
    LR_SCALES,
    Stratum,
    binomial_mad,
    detectable_tv,
    dirichlet_log_evalue,
    holm_correction,
    kt_regret,
    law_test,
    lr_detectable_tv,
    lr_log_evalue,
    lr_log_evalue_batch,
    lr_test,
    mixture_log_evalues,
    samples_for_tv,
    tv_confidence_interval,
    verdict_detectable_tv,
    verdict_samples_for_tv,
    verdict_test,
)
from lossless_check.stats.l1 import _null_l1

P = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])


def _shifted(p, tv):
    """A law at exactly ``tv`` from ``p``: move ``tv`` of mass from the largest to the smallest cell."""
    q = p.copy()
    q[np.argmax(p)] -= tv
    q[np.argmin(p)] += tv
    return q


def test_null_false_failure_rate_is_within_its_bound():
    """Many null samples at a loose alpha: the false-failure rate is not above alpha.

    One-sided exact binomial test of "rate <= alpha" on 2000 runs; it fails when that hypothesis is
    rejected at level 1e-4, so a correct implementation fails this test with probability <= 1e-4, and
    one whose true rate were 0.085 (1.7 alpha) fails it with probability > 0.99.
    """
    rng = np.random.default_rng(12345)
    alpha, runs = 0.05, 2000
    rejections = sum(law_test([Stratum(rng.multinomial(500, P), P)], alpha).rejects(alpha) for _ in range(runs))
    assert sps.binomtest(rejections, runs, alpha, alternative="greater").pvalue > 1e-4
    assert sps.binom.sf(sps.binom.isf(1e-4, runs, alpha), runs, 0.085) > 0.99  # the check's own power


def test_stratified_null_is_valid_too():
    rng = np.random.default_rng(7)
    laws = [P, P[::-1].copy(), np.full(8, 1 / 8)]
    alpha, runs = 0.1, 1000
    rejections = 0
    for _ in range(runs):
        strata = [Stratum(rng.multinomial(n, law), law) for n, law in zip((300, 120, 40), laws)]
        rejections += law_test(strata, alpha).rejects(alpha)
    # One-sided binomial test of "rate <= alpha" at level 1e-4 (the chance a correct test fails here).
    assert sps.binomtest(rejections, runs, alpha, alternative="greater").pvalue > 1e-4


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


# --------------------------------------------------------------------------------------------------
# Exact enumeration: every count vector of a small sample, with its multinomial probability


def compositions(n, k):
    """Every count vector of ``n`` samples over ``k`` cells, shape ``(C(n + k - 1, k - 1), k)``."""
    rows = []
    for bars in itertools.combinations(range(n + k - 1), k - 1):
        edges = (-1,) + bars + (n + k - 1,)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(k)])
    return np.array(rows)


def multinomial_pmf(counts, p):
    n = counts.sum(axis=1)
    with np.errstate(divide="ignore"):
        log_p = np.where(counts > 0, counts * np.log(np.where(p > 0, p, 1)), 0.0)
    return np.exp(gammaln(n + 1) - gammaln(counts + 1).sum(axis=1) + log_p.sum(axis=1))


SMALL = np.array([0.55, 0.3, 0.1, 0.05])


def test_binomial_mad_is_the_exact_mean_absolute_deviation():
    for n in (1, 2, 7, 40, 333):
        for p in (0.001, 0.05, 0.3, 0.5, 0.77, 1 / 3):
            x = np.arange(n + 1)
            exact = float((sps.binom.pmf(x, n, p) * np.abs(x - n * p)).sum())
            assert binomial_mad(n, p) == pytest.approx(exact, rel=1e-9, abs=1e-15)
            assert binomial_mad(n, p) <= np.sqrt(n * p * (1 - p)) + 1e-12
    assert binomial_mad(10, 0.0) == 0 and binomial_mad(10, 1.0) == 0 and binomial_mad(0, 0.5) == 0


@pytest.mark.parametrize("laws, sizes", [([SMALL], [30]), ([SMALL[:3] / SMALL[:3].sum(), np.array([0.5, 0.5, 0.0])], [14, 9])])
def test_every_l1_tail_bound_holds_exactly(laws, sizes):
    """The exact null law of S (by enumeration) is below every bound the L1 test uses, at every t.

    A deterministic check: no simulation, so it fails on any violation, however small."""
    values, probs = np.zeros(1), np.ones(1)
    for law, n in zip(laws, sizes):
        support = law > 0
        counts = compositions(n, int(support.sum()))
        s = np.abs(counts - n * law[support]).sum(axis=1)
        values = (values[:, None] + s[None, :]).ravel()
        probs = (probs[:, None] * multinomial_pmf(counts, law[support])[None, :]).ravel()
    null = _null_l1(sizes, laws, L1_BOUNDS)
    assert null.subsets_ok
    for v in np.unique(values)[::-1][:300]:
        t = v - 1e-9 * (1 + v)  # just below an attained value: P(S >= t) includes it
        exact = float(probs[values >= t].sum())
        for name, log_b in null.log_tails(float(t)).items():
            assert exact <= np.exp(min(log_b, 0.0)) * (1 + 1e-12), (name, t, exact)  # (pmf rounding)


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 1.0), min_size=2, max_size=9),
    n=st.integers(1, 20000),
    strata=st.integers(1, 3),
    alpha=st.floats(1e-10, 0.5),
)
def test_new_l1_thresholds_are_never_above_the_first_releases(weights, n, strata, alpha):
    """The subsets and exact-mean bounds only ever lower the threshold (and tv_detectable) of the L1 test."""
    p = np.asarray(weights) / np.sum(weights)
    laws, sizes = [p] * strata, [n] * strata
    new = _null_l1(sizes, laws, L1_BOUNDS).threshold(alpha)[0]
    old = _null_l1(sizes, laws, L1_BOUNDS_LEGACY).threshold(alpha)[0]
    assert new <= old * (1 + 1e-9)
    assert detectable_tv(sizes, len(p), laws, alpha) <= detectable_tv(sizes, len(p), laws, alpha, bounds=L1_BOUNDS_LEGACY) + 1e-12


def test_legacy_bounds_are_the_first_release_test():
    """The issue's worst-case guarantee (11,510 trials at TV 0.05, alpha 1e-6, vocabulary 8) and the first
    release's p-value formula, kept for comparisons."""
    assert samples_for_tv(0.05, 8, 1e-6) == 11510
    counts = np.random.default_rng(1).multinomial(400, P)
    old = law_test([Stratum(counts, P)], 1e-3, bounds=L1_BOUNDS_LEGACY)
    s = np.abs(counts - 400 * P).sum()
    k = len(P)
    types = k * np.log(2) - s**2 / 800
    m = np.sqrt(400 * P * (1 - P)).sum()
    mcd = -max(s - m, 0) ** 2 / 800
    assert old.pvalue == pytest.approx(min(1.0, np.exp(min(types, mcd, 0.0))), rel=1e-12)


def test_many_strata_are_fast_and_use_mcdiarmid():
    rng = np.random.default_rng(4)
    laws = [rng.dirichlet(np.ones(8)) for _ in range(300)]
    strata = [Stratum(rng.multinomial(int(n), law), law) for n, law in zip(rng.integers(1, 30, 300), laws)]
    result = verdict_test(strata, 1e-6)
    assert result.bound == "mcdiarmid" and not result.rejects(1e-6)


# --------------------------------------------------------------------------------------------------
# The likelihood-ratio e-value


def test_every_lr_component_is_an_e_value_with_mean_exactly_one():
    """E_p[E] = 1 for the KT prior and every centred prior (by enumeration of every count vector)."""
    for n in (1, 3, 17):
        counts = compositions(n, len(SMALL))
        pmf = multinomial_pmf(counts, SMALL)
        assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
        assert (pmf * np.exp(dirichlet_log_evalue(counts, SMALL))).sum() == pytest.approx(1.0, abs=1e-10)
        for kappa in LR_SCALES:
            e = np.exp(dirichlet_log_evalue(counts, SMALL, kappa * n))
            assert (pmf * e).sum() == pytest.approx(1.0, abs=1e-10)
        assert (pmf * np.exp(lr_log_evalue_batch(counts, SMALL))).sum() == pytest.approx(1.0, abs=1e-10)


def test_a_tiny_stratum_costs_nothing_under_a_centred_prior():
    p = np.array([0.7, 0.2, 0.1])
    for x in range(3):
        assert dirichlet_log_evalue(np.eye(3)[x], p, 0.25) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("k, sizes", [(2, range(1, 200)), (3, (1, 2, 5, 30, 80)), (5, (1, 4, 12))])
def test_kt_regret_bound_holds_for_every_count_vector(k, sizes):
    for n in sizes:
        counts = compositions(n, k)
        with np.errstate(divide="ignore", invalid="ignore"):
            ml = np.where(counts > 0, counts * np.log(counts / n), 0.0).sum(axis=1)
        log_kt = gammaln(k / 2) - k * gammaln(0.5) + gammaln(counts + 0.5).sum(axis=1) - gammaln(n + k / 2)
        assert (ml - log_kt).max() <= kt_regret(k, n) + 1e-9


def test_lr_batch_matches_strata_and_tokens_outside_the_support_are_ignored():
    rng = np.random.default_rng(2)
    counts = rng.multinomial(300, P, size=5)
    batch = lr_log_evalue_batch(counts, P)
    assert batch == pytest.approx([lr_log_evalue([Stratum(c, P)]) for c in counts], rel=1e-12)
    law = np.array([0.5, 0.5, 0.0])
    assert lr_log_evalue([Stratum(np.array([10, 12, 3]), law)]) == pytest.approx(
        lr_log_evalue([Stratum(np.array([10, 12, 0]), law)]))
    assert lr_test([Stratum(np.array([10, 12, 3]), law)], 1e-6).support_violations == 3


def test_lr_test_is_the_stronger_test_against_mass_moved_into_a_rare_token():
    """600 trials, 0.05 of mass from the likeliest token into the rarest (p = 0.02 -> 0.07): the L1 test
    at alpha 1e-6 misses it, the likelihood ratio finds it, and the verdict says which component did."""
    alt = _shifted(P, 0.05)
    counts = np.random.default_rng(0).multinomial(600, alt)
    assert not law_test([Stratum(counts, P)], 1e-6).rejects(1e-6)
    verdict = verdict_test([Stratum(counts, P)], 1e-6)
    assert verdict.rejects(1e-6) and verdict.rejected_by == ("lr",)
    assert verdict.pvalue == pytest.approx(min(1.0, 2 * verdict.l1_pvalue, 2 * verdict.lr_pvalue))


@pytest.mark.parametrize("n", [3000])
def test_lr_power_guarantee_holds(n):
    """At lr_detectable_tv (its worst-case guarantee) the LR test alone rejects in >= 99% of 300 runs
    (one-sided binomial test of "miss rate <= 0.01" at level 1e-4: the chance a correct test fails here)."""
    rng = np.random.default_rng(n)
    tv = lr_detectable_tv([n], len(P), [P], 1e-6)
    assert tv < 0.28
    alt = _shifted(P, tv)
    misses = sum(not lr_test([Stratum(c, P)], 1e-6).rejects(1e-6) for c in rng.multinomial(n, alt, size=300))
    assert sps.binomtest(misses, 300, 0.01, alternative="greater").pvalue > 1e-4


# --------------------------------------------------------------------------------------------------
# The verdict


def test_verdict_combines_what_the_engine_reads():
    counts = np.random.default_rng(3).multinomial(2000, P)
    law = law_test([Stratum(counts, P)], 0.5e-6)
    verdict = verdict_test([Stratum(counts, P)], 1e-6)
    assert verdict.statistic == law.statistic and verdict.n == law.n == 2000
    assert verdict.threshold_tv == law.threshold_tv and verdict.l1_pvalue == law.pvalue
    assert verdict.chi2 == law.chi2 and verdict.chi2_pvalue == law.chi2_pvalue
    assert verdict.tv_detectable == min(verdict.tv_detectable_l1, verdict.tv_detectable_lr)
    assert verdict.tv_detectable == pytest.approx(verdict_detectable_tv([2000], 8, [P], 1e-6))
    assert not verdict.rejects(1e-6) and verdict.rejected_by == ()
    with pytest.raises(ValueError):
        verdict_test([Stratum(counts, P)], 1e-6, share_l1=1.0)


def test_verdict_support_violation_is_an_exact_failure():
    result = verdict_test([Stratum(np.array([500, 499, 1]), np.array([0.5, 0.5, 0.0]))], 1e-12)
    assert result.support_violations == 1 and result.rejects(1e-300) and "support" in result.rejected_by
    empty = verdict_test([], 1e-6)
    assert empty.pvalue == 1.0 and empty.n == 0 and not empty.rejects(1e-6)


def test_verdict_samples_for_tv_inverts_its_guarantee():
    n = verdict_samples_for_tv(0.05, 8, 1e-6)
    assert verdict_detectable_tv([n], 8, None, 1e-6) <= 0.05 < verdict_detectable_tv([n - 1], 8, None, 1e-6)
    # The alpha split costs the worst case (every null law) about 2%; with the exact law the L1 test's
    # new bounds more than pay for it.
    assert n <= 1.03 * samples_for_tv(0.05, 8, 1e-6)
    assert verdict_detectable_tv([n], 8, [P], 1e-6) < detectable_tv([n], 8, [P], 1e-6, bounds=L1_BOUNDS_LEGACY)


# --------------------------------------------------------------------------------------------------
# One precision: the exact law is the law of the real path's dtype

#: Logits whose last token sits at the EpsilonLogitsWarper(0.06) cutoff: float64 removes it, float32 keeps it.
EPSILON_LOGITS = [-1.546, 0.474, 0.516, 0.835, -1.421, -0.794, -0.524, -0.7935151912938292]


def test_exact_law_keeps_a_token_float32_keeps_at_an_epsilon_cutoff():
    """``epsilon_cutoff=0.06`` and a token whose probability is 0.06 up to float32 rounding: float64
    says 0 (the first release's ExactLaws, which then reported every sample of it as an exact
    'support' failure of a lossless sampler), float32 -- the dtype of the stub's logits, of the
    processors and of the sampler's softmax -- keeps it at 0.068. Plain sampling through the real
    ``generate()`` emits it; the exact law must say so, and the verdict must pass."""
    import torch
    from transformers import EpsilonLogitsWarper, LogitsProcessorList

    from lossless_check.laws.expected import ExactLaws
    from lossless_check.laws.scenarios import Scenario
    from lossless_check.laws.stubs import fixed_logits_lm
    from lossless_check.laws.tables import FixedLogits

    table = FixedLogits.iid(EPSILON_LOGITS)
    warper = EpsilonLogitsWarper(0.06)
    in64 = torch.softmax(warper(None, torch.tensor([EPSILON_LOGITS], dtype=torch.float64)), -1)[0]
    assert in64[7] == 0  # the case is what it claims to be
    scenario = Scenario("epsilon", table, table, prompt=(0,), gamma=1)
    law = ExactLaws(scenario, LogitsProcessorList([warper])).target()
    assert law[7] == pytest.approx(0.0682, abs=1e-4) and law.sum() == pytest.approx(1.0, abs=1e-15)

    model = fixed_logits_lm(table, prompt_length=1)
    torch.manual_seed(0)
    rows = 3000
    out = model.generate(torch.zeros((rows, 1), dtype=torch.long), attention_mask=torch.ones((rows, 1), dtype=torch.long),
                         do_sample=True, epsilon_cutoff=0.06, max_new_tokens=1)
    counts = np.bincount(out[:, 1].numpy(), minlength=len(EPSILON_LOGITS))
    assert counts[7] > 0
    verdict = verdict_test([Stratum(counts, law)], 1e-6)
    assert verdict.support_violations == 0 and not verdict.rejects(1e-6), verdict
