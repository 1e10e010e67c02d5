"""Tests of an empirical token law against an exact one, with finite-sample error guarantees.

The central object is a *stratified* sample: groups (strata) of tokens, each group drawn i.i.d.
from its own exactly known distribution ``p_s`` under the null hypothesis. One position of a
speculative-decoding round is one such sample: the strata are the distinct target distributions
``p_j(. | prefix)`` met by the trials that reached position ``j``.

Statistic: ``S = sum_s || c_s - n_s p_s ||_1`` (``c_s`` the counts of stratum ``s``), i.e. twice the
sample-weighted total-variation distance times ``N``. Two bounds on its null tail hold for every
sample size (no asymptotics), and the smaller threshold at the test's alpha is used; the choice
depends only on ``p`` and ``n``, never on the data, so the p-value stays valid:

- *types/union bound* (Weissman et al. 2003, extended to a product of multinomials):
  ``P(S >= t) <= 2^K exp(-t^2 / (2N))`` with ``K = sum_s |supp p_s|``;
- *McDiarmid + Jensen*: ``E S <= m = sum_{s,i} sqrt(n_s p_si (1 - p_si))`` and one sample moves
  ``S`` by at most 2, so ``P(S >= m + t) <= exp(-t^2 / (2N))``.

Power comes from the same inequalities applied to the unknown true law ``r`` (with the vocabulary
size in place of the support), so a "detectable TV" is a guarantee, not a normal approximation.
Pearson chi-square and G statistics (scipy, asymptotic) are reported beside as diagnostics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from scipy import stats as sps

#: Cells with an expected count below this are pooled before the chi-square / G diagnostics.
MIN_EXPECTED_COUNT = 5.0


@dataclass(frozen=True)
class Stratum:
    """Counts observed in one group and the exact law they should follow."""

    counts: np.ndarray  # int, shape (V,)
    expected: np.ndarray  # float64 probabilities, shape (V,)

    @property
    def n(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True)
class LawTestResult:
    """Result of :func:`law_test` (scipy.stats style: ``statistic`` and ``pvalue``)."""

    statistic: float  # S / (2N): the sample-weighted TV distance
    pvalue: float  # finite-sample valid p-value
    n: int
    bound: str  # "types" or "mcdiarmid"
    threshold_tv: float  # reject when statistic exceeds this at the given alpha
    tv_detectable: float  # smallest weighted TV detected with probability >= power
    support_violations: int  # samples on tokens with expected probability 0
    chi2: float | None = None
    chi2_dof: int = 0
    chi2_pvalue: float | None = None
    g: float | None = None
    g_pvalue: float | None = None

    def rejects(self, alpha: float) -> bool:
        return self.support_violations > 0 or self.pvalue <= alpha


def _bound_terms(strata: Sequence[Stratum], null_side: bool) -> tuple[float, float, int]:
    """(N, Jensen mean term m, K) for the null side (exact p) or the power side (worst case r)."""
    n_total = sum(s.n for s in strata)
    if null_side:
        m = sum(float(np.sqrt(s.n * s.expected * (1 - s.expected)).sum()) for s in strata)
        k = sum(int((s.expected > 0).sum()) for s in strata)
    else:
        # max over r of sum_i sqrt(r_i (1 - r_i)) is sqrt(V - 1)
        m = sum(math.sqrt(s.n * (len(s.expected) - 1)) for s in strata)
        k = sum(len(s.expected) for s in strata)
    return float(n_total), m, k


def _threshold(n_total: float, m: float, k: int, level: float) -> tuple[float, str]:
    """Smallest ``t`` with a bound guaranteeing ``P(S >= t) <= level``, and which bound gave it."""
    log_inv = math.log(1.0 / level)
    t_types = math.sqrt(2.0 * n_total * (k * math.log(2.0) + log_inv))
    t_mcd = m + math.sqrt(2.0 * n_total * log_inv)
    return (t_types, "types") if t_types <= t_mcd else (t_mcd, "mcdiarmid")


def _pvalue(s_stat: float, n_total: float, m: float, k: int, bound: str) -> float:
    if n_total == 0:
        return 1.0
    if bound == "types":
        log_p = k * math.log(2.0) - s_stat**2 / (2.0 * n_total)
    else:
        excess = max(s_stat - m, 0.0)
        log_p = -(excess**2) / (2.0 * n_total)
    return float(min(1.0, math.exp(min(log_p, 0.0))))


def detectable_tv(strata_sizes: Sequence[int], vocab_size: int, expected: Sequence[np.ndarray] | None,
                  alpha: float, power: float = 0.99) -> float:
    """Smallest sample-weighted TV that :func:`law_test` rejects with probability ``>= power``.

    ``expected`` (the null laws, for the Jensen term) may be ``None``; then the worst case is used.
    """
    n_total = float(sum(strata_sizes))
    if n_total == 0:
        return 1.0
    if expected is None:
        expected = [np.full(vocab_size, 1.0 / vocab_size)] * len(strata_sizes)
    m0 = sum(float(np.sqrt(n * e * (1 - e)).sum()) for n, e in zip(strata_sizes, expected))
    k0 = sum(int((e > 0).sum()) for e in expected)
    m1 = sum(math.sqrt(n * (vocab_size - 1)) for n in strata_sizes)
    k1 = vocab_size * len(strata_sizes)
    t_alpha, _ = _threshold(n_total, m0, k0, alpha)
    t_beta, _ = _threshold(n_total, m1, k1, 1.0 - power)
    return min(1.0, (t_alpha + t_beta) / (2.0 * n_total))


def samples_for_tv(tv: float, vocab_size: int, alpha: float, power: float = 0.99) -> int:
    """Samples one stratum needs so that :func:`law_test` detects ``tv`` with probability ``>= power``.

    Worst case over null laws of size ``vocab_size``; the detectable TV scales as ``1/sqrt(n)``.
    """
    if not 0 < tv <= 1:
        raise ValueError("tv must be in (0, 1]")
    ref = 10_000
    d = detectable_tv([ref], vocab_size, None, alpha, power)
    return int(math.ceil(ref * (d / tv) ** 2))


def _pooled_cells(counts: np.ndarray, expected_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool the cells whose expected count is below MIN_EXPECTED_COUNT into one cell.

    Rule: cells with expected count < 5 are merged (with each other) into one pooled cell; if that
    pooled cell is still below 5 it is merged with the smallest remaining cell. Zero-expected cells
    are dropped (they are the support check's business) and the rest rescaled to the kept count.
    """
    keep = expected_counts > 0
    counts, expected_counts = counts[keep], expected_counts[keep]
    if counts.sum() > 0:
        expected_counts = expected_counts * (counts.sum() / expected_counts.sum())
    small = expected_counts < MIN_EXPECTED_COUNT
    if small.any():
        pooled_c, pooled_e = counts[small].sum(), expected_counts[small].sum()
        counts, expected_counts = counts[~small], expected_counts[~small]
        if pooled_e < MIN_EXPECTED_COUNT and len(expected_counts) > 0:
            j = int(np.argmin(expected_counts))
            pooled_c, pooled_e = pooled_c + counts[j], pooled_e + expected_counts[j]
            counts, expected_counts = np.delete(counts, j), np.delete(expected_counts, j)
        counts = np.append(counts, pooled_c)
        expected_counts = np.append(expected_counts, pooled_e)
    return counts, expected_counts


def _chi2_diagnostics(strata: Sequence[Stratum]) -> tuple[float | None, int, float | None, float | None, float | None]:
    chi2 = g = 0.0
    dof = 0
    for s in strata:
        c, e = _pooled_cells(s.counts.astype(np.float64), s.n * s.expected)
        if len(c) < 2 or c.sum() == 0:  # nothing inside the support: the support check speaks
            continue
        chi2 += float(sps.power_divergence(c, e, lambda_="pearson").statistic)
        g += float(sps.power_divergence(c, e, lambda_="log-likelihood").statistic)
        dof += len(c) - 1
    if dof == 0:
        return None, 0, None, None, None
    return chi2, dof, float(sps.chi2.sf(chi2, dof)), g, float(sps.chi2.sf(g, dof))


def law_test(strata: Sequence[Stratum], alpha: float, power: float = 0.99) -> LawTestResult:
    """Test that every stratum's counts follow its expected law.

    Assumptions: within a stratum the samples are i.i.d. from ``expected``; strata are independent
    given their sizes (sizes may depend on earlier, independent data). Under that null,
    ``P(pvalue <= a) <= a`` for every ``a`` and every sample size. A sample on a token of expected
    probability zero is a ``support_violation`` and an exact failure.
    """
    strata = [s for s in strata if s.n > 0]
    if not strata:
        return LawTestResult(0.0, 1.0, 0, "types", 1.0, 1.0, 0)
    violations = sum(int(s.counts[s.expected <= 0].sum()) for s in strata)
    s_stat = sum(float(np.abs(s.counts - s.n * s.expected).sum()) for s in strata)
    n_total, m, k = _bound_terms(strata, null_side=True)
    t_alpha, bound = _threshold(n_total, m, k, alpha)
    pvalue = _pvalue(s_stat, n_total, m, k, bound)
    vocab = len(strata[0].expected)
    tv_det = detectable_tv([s.n for s in strata], vocab, [s.expected for s in strata], alpha, power)
    chi2, dof, chi2_p, g, g_p = _chi2_diagnostics(strata)
    return LawTestResult(
        statistic=s_stat / (2.0 * n_total),
        pvalue=pvalue,
        n=int(n_total),
        bound=bound,
        threshold_tv=t_alpha / (2.0 * n_total),
        tv_detectable=tv_det,
        support_violations=violations,
        chi2=chi2,
        chi2_dof=dof,
        chi2_pvalue=chi2_p,
        g=g,
        g_pvalue=g_p,
    )


def tv_confidence_interval(strata: Sequence[Stratum], confidence: float = 0.95) -> tuple[float, float]:
    """Finite-sample interval for the sample-weighted TV between the true laws and the expected ones.

    ``|TV_hat - TV| <= ||p_hat - r||_1 / 2`` and the bounds above hold for any true law ``r``.
    """
    strata = [s for s in strata if s.n > 0]
    if not strata:
        return 0.0, 1.0
    n_total, m, k = _bound_terms(strata, null_side=False)
    t, _ = _threshold(n_total, m, k, 1.0 - confidence)
    tv_hat = sum(float(np.abs(s.counts - s.n * s.expected).sum()) for s in strata) / (2.0 * n_total)
    half = t / (2.0 * n_total)
    return max(0.0, tv_hat - half), min(1.0, tv_hat + half)


def mixture_log_evalues(strata: np.ndarray, tokens: np.ndarray, laws: Sequence[np.ndarray]) -> np.ndarray:
    """Running log e-value of a stream of observations against exact laws (an anytime-valid test).

    Observation ``t`` is token ``tokens[t]`` of stratum ``strata[t]``, whose null law is
    ``laws[strata[t]]``. Each stratum bets with the Krichevsky-Trofimov predictor (the
    Dirichlet(1/2) mixture over the null law's support): the increment is
    ``log KT(x_t | earlier x of its stratum) - log p(x_t)``. The cumulative sum is the log of a
    nonnegative martingale with mean 1 under the null whenever each observation, given everything
    observed before it, follows its stratum's law, so by Ville's inequality
    ``P(exists t: E_t >= 1/alpha) <= alpha``: it may be looked at after every observation.

    Against a true law ``r`` it grows like ``n KL(r || p) - (K - 1)/2 log n`` (``K`` the support
    size), which is within that regret of the optimal likelihood-ratio test that knows ``r``.
    Observations outside their law's support add nothing here: they are exact failures.
    """
    increments = np.zeros(len(tokens))
    for s, law in enumerate(laws):
        where = np.flatnonzero(strata == s)
        if where.size == 0:
            continue
        x = tokens[where]
        inside = law[x] > 0
        where, x = where[inside], x[inside]
        seen = np.zeros((x.size, law.size), dtype=np.int64)
        seen[np.arange(x.size), x] = 1
        before = (np.cumsum(seen, axis=0) - seen)[np.arange(x.size), x]
        k = int((law > 0).sum())
        increments[where] = np.log((before + 0.5) / (np.arange(x.size) + 0.5 * k)) - np.log(law[x])
    return np.cumsum(increments)


def holm_correction(pvalues: Sequence[float]) -> np.ndarray:
    """Holm step-down adjusted p-values: reject ``i`` at family rate ``a`` iff ``adjusted[i] <= a``.

    Controls the family-wise error rate under any dependence between the tests.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    n = len(p)
    if n == 0:
        return p
    order = np.argsort(p)
    adjusted = np.empty(n)
    running = 0.0
    for rank, idx in enumerate(order):
        running = max(running, min(1.0, (n - rank) * p[idx]))
        adjusted[idx] = running
    return adjusted


def bonferroni_min(pvalues: Sequence[float]) -> float:
    """Valid combined p-value of several tests of one hypothesis: ``min(1, k * min p)``."""
    pvalues = [p for p in pvalues if p is not None]
    if not pvalues:
        return 1.0
    return float(min(1.0, len(pvalues) * min(pvalues)))


@dataclass
class AcceptanceLaw:
    """Exact law of ``n_matches`` over ``0..gamma`` for a round with known drafter and target."""

    probabilities: np.ndarray
    gamma: int = field(init=False)

    def __post_init__(self) -> None:
        self.gamma = len(self.probabilities) - 1

    @property
    def mean_acceptance_rate(self) -> float:
        """Expected accepted drafts per drafted token: ``E[n_matches] / gamma``."""
        return float(np.dot(np.arange(self.gamma + 1), self.probabilities) / max(self.gamma, 1))
