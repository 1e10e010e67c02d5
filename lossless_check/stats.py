"""Tests of an empirical token law against an exact one, with finite-sample error guarantees.

The central object is a *stratified* sample: groups (strata) of tokens, each group drawn i.i.d.
from its own exactly known distribution ``p_s`` under the null hypothesis. One position of a
speculative-decoding round is one such sample: the strata are the distinct target distributions
``p_j(. | prefix)`` met by the trials that reached position ``j``. Every guarantee below holds
*conditionally on the stratum sizes* ``n_s`` (they may depend on earlier, independent data: the
tokens before the tested one), for every sample size: nothing here is asymptotic.

Two tests, and the verdict that combines them (:func:`verdict_test`):

**L1 / total-variation test** (:func:`law_test`). Statistic ``S = sum_s || c_s - n_s p_s ||_1``
(``c_s`` the counts of stratum ``s``), i.e. twice the sample-weighted TV distance times
``N = sum_s n_s``. Its p-value is the smallest of several valid bounds on the null tail
``P(S >= t)``, each a function of ``t``, ``p`` and ``n`` only (the minimum of valid tail bounds is a
valid tail bound, so ``P(pvalue <= a) <= a`` for every ``a``):

- ``types`` (Weissman et al. 2003, extended to a product of multinomials):
  ``P(S >= t) <= 2^K exp(-t^2 / (2N))`` with ``K = sum_s |supp p_s|``;
- ``mcdiarmid``: one sample moves ``S`` by at most 2, so ``P(S >= E S + t) <= exp(-t^2 / (2N))``, with
  ``E S = sum_{s,i} E|Bin(n_s, p_si) - n_s p_si|`` computed exactly (de Moivre's closed form,
  :func:`binomial_mad`; the release before used the larger Jensen bound ``sqrt(n p (1 - p))``);
- ``subsets``: ``S / 2 = sum_s max_A (c_s(A) - n_s p_s(A))`` over token sets ``A``, so a union bound
  over one set per stratum with the exact binomial moment generating function (Chernoff), which
  factorises over strata: ``P(S >= t) <= inf_l e^{-l t / 2} prod_s sum_A E e^{l (c_s(A) - n_s p_s(A))}``;
  for a single stratum also the union of the exact binomial tails ``sum_A P(c(A) >= n p(A) + t/2)``.
  It replaces ``types`` where both apply (Hoeffding's bound on each set's moment generating function
  gives ``types`` back). A support of more than :data:`MAX_ENUMERATED_SUPPORT` tokens uses the
  Poisson (Bennett) bound on each set's generating function, which factorises over tokens.

**Likelihood-ratio test** (:func:`lr_test`). A fixed-sample e-value: per stratum the marginal
likelihood of the counts under a Dirichlet prior on the stratum's law, over the support of ``p_s``,
divided by their likelihood under ``p_s``; the product over strata; a finite mixture of such
products over a few priors fixed before the data. ``E_p[E] = 1`` for any prior (exchange the
prior integral and the expectation), so ``P(E >= 1/a) <= a`` by Markov's inequality, at every
``n``, and ``pvalue = min(1, 1/E)``. It is the chi-square-family test: its log grows like
``n KL(r || p)`` against a true law ``r``, which sees mass moved into rare tokens far sooner than
the L1 distance does.

**Verdict** (:func:`verdict_test`): ``alpha`` is split, ``share_l1 * alpha`` to the L1 test and the
rest to the likelihood-ratio test; the combined p-value ``min(1, p_l1 / share_l1,
p_lr / (1 - share_l1))`` is valid by the union bound. Its power guarantee ``tv_detectable`` is the
better of the two components' (the combined test rejects whenever either does).

**Many strata, large supports** (rules that depend on the laws and stratum sizes only, never on the
counts). The ``types`` bound pays ``2^K`` with ``K`` the support summed over strata, useless with many
strata. The L1 test computes ``subsets`` for at most :data:`MAX_SUBSET_STRATA` strata and enumerates
supports of at most :data:`MAX_ENUMERATED_SUPPORT` tokens (Bennett beyond); past that, ``mcdiarmid``
(exact mean, no ``2^K``) carries it. The likelihood ratio pools the strata through one prior scale
shared by all of them (a product over strata inside each mixture component), and a prior centred on
``p_s`` gives a one-sample stratum the e-value 1 exactly, so many small strata and large supports
cost it nothing: no coarsening is needed there (``benchmarks/power_table.py``, 40-strata rows).

Power of the L1 test comes from the same inequalities applied to the unknown true law ``r`` (with
the vocabulary size in place of the support), so a "detectable TV" is a guarantee, not a normal
approximation. Pearson chi-square and G statistics (scipy, asymptotic) are reported beside as
diagnostics only: their p-values are not valid at small alpha.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import optimize
from scipy.special import bdtrc, chdtrc, gammaln, logsumexp

#: Cells with an expected count below this are pooled before the chi-square / G diagnostics.
MIN_EXPECTED_COUNT = 5.0

#: Supports up to this size have their token sets enumerated by the ``subsets`` bound.
MAX_ENUMERATED_SUPPORT = 12

#: The ``subsets`` bound is computed for at most this many strata (beyond, ``mcdiarmid`` wins anyway:
#: each stratum costs the union bound about ``|supp| log 2``). A function of the stratum count only.
MAX_SUBSET_STRATA = 64

#: The L1 tail bounds :func:`law_test` takes the best of, and the two the first release used.
L1_BOUNDS: tuple[str, ...] = ("types", "mcdiarmid", "subsets")
L1_BOUNDS_LEGACY: tuple[str, ...] = ("types", "mcdiarmid_jensen")


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
    bound: str  # the bound with the smallest threshold at alpha: "types", "mcdiarmid" or "subsets"
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


# ---------------------------------------------------------------------------------------------
# Null tail bounds of the L1 statistic


def binomial_mad(n, p) -> np.ndarray:
    """Exact mean absolute deviation ``E|X - n p|`` of ``X ~ Bin(n, p)`` (vectorised).

    De Moivre's closed form: ``2 k C(n, k) p^k (1 - p)^(n - k + 1)`` with ``k = floor(n p) + 1``
    (Berend and Kontorovich 2013); ``0`` where ``p`` is 0 or 1 or ``n`` is 0. It is at most the
    Jensen bound ``sqrt(n p (1 - p))`` and about ``sqrt(2 / pi)`` of it for large ``n p (1 - p)``.
    """
    n, p = np.broadcast_arrays(np.asarray(n, dtype=np.float64), np.asarray(p, dtype=np.float64))
    out = np.zeros(n.shape)
    inside = (p > 0) & (p < 1) & (n > 0)
    nn, pp = n[inside], p[inside]
    k = np.minimum(np.floor(nn * pp) + 1, nn)
    log_mad = (math.log(2.0) + np.log(k) + gammaln(nn + 1) - gammaln(k + 1) - gammaln(nn - k + 1)
               + k * np.log(pp) + (nn - k + 1) * np.log1p(-pp))
    out[inside] = np.exp(log_mad)
    return out


@lru_cache(maxsize=16)
def _subset_masks(k: int) -> np.ndarray:
    """Indicator rows of the proper non-empty subsets of ``k`` tokens, shape ``(2^k - 2, k)``."""
    masks = np.array(list(itertools.product((0.0, 1.0), repeat=k)))
    return masks[1:-1]


#: Added to the log of the numerically computed ``subsets`` bounds: covers float rounding (1e-6 relative).
_ROUNDING_SLACK = 1e-6


class _NullL1:
    """Null tail bounds ``P(S >= t) <= B(t)`` of the L1 statistic for strata of sizes ``n_s`` and laws ``p_s``.

    Every bound is a function of ``t``, the laws and the sizes only; any of them, and their minimum,
    is a valid tail bound, so the p-value ``min_b B_b(S)`` is valid whatever ``alpha`` chose.
    """

    def __init__(self, sizes: Sequence[int], laws: Sequence[np.ndarray], bounds: Sequence[str] = L1_BOUNDS):
        unknown = set(bounds) - {"types", "mcdiarmid", "mcdiarmid_jensen", "subsets"}
        if unknown:
            raise ValueError(f"unknown L1 bounds {sorted(unknown)}")
        self.bounds = tuple(bounds)
        self.sizes = [int(n) for n in sizes]
        self.laws = [np.asarray(law, dtype=np.float64) for law in laws]
        self.n_total = float(sum(self.sizes))
        self.k = sum(int((law > 0).sum()) for law in self.laws)
        self.m_jensen = sum(float(np.sqrt(n * law * (1 - law)).sum()) for n, law in zip(self.sizes, self.laws))
        # Rounding slack: the exact mean is computed to ~1e-13 relative; inflate it a little.
        self.m_exact = sum(float(binomial_mad(n, law).sum()) for n, law in zip(self.sizes, self.laws)) * (1 + 1e-9)
        # Strata whose S_s is not identically 0 (support of at least two tokens).
        informative = [(n, law[law > 0]) for n, law in zip(self.sizes, self.laws) if n > 0 and (law > 0).sum() >= 2]
        self.subsets_ok = "subsets" in self.bounds and 0 < len(informative) <= MAX_SUBSET_STRATA
        if self.subsets_ok:
            pis, groups, ns, bennett = [], [], [], []
            for n, support in informative:
                if len(support) <= MAX_ENUMERATED_SUPPORT:
                    pi = np.clip(_subset_masks(len(support)) @ support, 1e-300, 1.0)
                    pis.append(pi)
                    groups.append(np.full(len(pi), len(ns)))
                    ns.append(n)
                else:
                    bennett.append((n, support))
            self._pi = np.concatenate(pis) if pis else np.zeros(0)
            group = np.concatenate(groups) if groups else np.zeros(0, dtype=int)
            self._group_n = np.asarray(ns, dtype=np.float64)
            self._n_of_pi = self._group_n[group] if group.size else np.zeros(0)
            self._starts = np.flatnonzero(np.r_[True, np.diff(group) != 0]) if group.size else group
            self._lengths = np.diff(np.r_[self._starts, group.size]) if group.size else group
            self._log_pi = np.log(self._pi)
            self._log_1m_pi = np.log1p(-np.minimum(self._pi, 1 - 1e-16))
            self._bennett = bennett
            # One stratum, enumerated: the exact binomial tails of its sets are usable too.
            self._exact_single = len(informative) == 1 and not bennett
            if self._exact_single:
                self._single_n = ns[0]

    # -- the subsets bound ------------------------------------------------------------------
    def _log_mgf_sum(self, lam: float) -> float:
        """``sum_s log sum_A E exp(lam (c_s(A) - n_s p_s(A)))`` (an upper bound for Bennett strata)."""
        total = 0.0
        if self._pi.size:
            log_m = self._n_of_pi * (np.logaddexp(self._log_1m_pi, self._log_pi + lam) - lam * self._pi)
            top = np.maximum.reduceat(log_m, self._starts)
            spread = np.repeat(top, self._lengths)
            total += float((top + np.log(np.add.reduceat(np.exp(log_m - spread), self._starts))).sum())
        psi = math.expm1(lam) - lam
        for n, support in self._bennett:
            total += float(np.logaddexp(0.0, n * support * psi).sum())
        return total

    def _chernoff_log_tail(self, t: float) -> float:
        u = t / 2.0
        if u <= 0:
            return 0.0
        f = lambda lam: self._log_mgf_sum(lam) - lam * u  # convex in lam
        guess = min(4.0 * u / self.n_total, 50.0)  # Hoeffding's optimum
        res = optimize.minimize_scalar(f, bounds=(1e-9, 50.0), method="bounded", options={"xatol": 1e-7})
        return min(f(guess), float(res.fun))  # any lam gives a valid bound

    def _chernoff_threshold(self, log_inv: float) -> float:
        g = lambda lam: 2.0 * (self._log_mgf_sum(lam) + log_inv) / lam  # quasi-convex in lam
        res = optimize.minimize_scalar(g, bounds=(1e-9, 50.0), method="bounded", options={"xatol": 1e-9})
        guess = math.sqrt(8.0 * (self.k * math.log(2.0) + log_inv) / self.n_total)
        return min(g(guess), float(res.fun))

    def _exact_tail(self, t: float) -> float:
        n, pi = self._single_n, self._pi
        x = n * pi + t / 2.0
        k = np.ceil(x - 1e-9 * (1.0 + x))  # c(A) >= n p(A) + t/2, rounded towards the larger tail
        k = np.clip(k - 1, -1.0, float(n))  # P(c(A) > k): 1 below 0, 0 from n on
        tails = np.where(k >= n, 0.0, bdtrc(k, n, pi))
        return float(tails.sum())

    def _exact_threshold(self, level: float) -> float:
        lo, hi = 0.0, 2.0 * self._single_n + 2.0
        if self._exact_tail(hi) > level:
            return math.inf
        while hi - lo > 1e-7 * (1.0 + hi):
            mid = 0.5 * (lo + hi)
            if self._exact_tail(mid) <= level:
                hi = mid
            else:
                lo = mid
        return hi

    # -- public side ------------------------------------------------------------------------
    def log_tails(self, t: float) -> dict[str, float]:
        """log of each bound on ``P(S >= t)``."""
        n = self.n_total
        out: dict[str, float] = {}
        if "types" in self.bounds:
            out["types"] = self.k * math.log(2.0) - t * t / (2.0 * n)
        if "mcdiarmid" in self.bounds:
            out["mcdiarmid"] = -(max(t - self.m_exact, 0.0) ** 2) / (2.0 * n)
        if "mcdiarmid_jensen" in self.bounds:
            out["mcdiarmid"] = -(max(t - self.m_jensen, 0.0) ** 2) / (2.0 * n)
        if self.subsets_ok:
            if self._exact_single:  # each exact tail is below its Chernoff bound: no need for the latter
                exact = self._exact_tail(t)
                log_b = math.log(exact) if exact > 0 else -math.inf
            else:
                log_b = self._chernoff_log_tail(t)
            out["subsets"] = log_b + _ROUNDING_SLACK
        return out

    def pvalue(self, s_stat: float) -> float:
        if self.n_total == 0:
            return 1.0
        return float(min(1.0, math.exp(min(0.0, min(self.log_tails(s_stat).values())))))

    def thresholds(self, level: float) -> dict[str, float]:
        """Per bound, a ``t`` with ``B(t) <= level`` (the smallest, up to numerical tolerance)."""
        if level >= 1.0:  # P(S >= 0) = 1: every sample is past the threshold
            return {b if b != "mcdiarmid_jensen" else "mcdiarmid": 0.0 for b in self.bounds}
        n, log_inv = self.n_total, math.log(1.0 / level)
        out: dict[str, float] = {}
        if "types" in self.bounds:
            out["types"] = math.sqrt(2.0 * n * (self.k * math.log(2.0) + log_inv))
        if "mcdiarmid" in self.bounds:
            out["mcdiarmid"] = self.m_exact + math.sqrt(2.0 * n * log_inv)
        if "mcdiarmid_jensen" in self.bounds:
            out["mcdiarmid"] = self.m_jensen + math.sqrt(2.0 * n * log_inv)
        if self.subsets_ok:
            if self._exact_single:
                out["subsets"] = self._exact_threshold(level * math.exp(-_ROUNDING_SLACK))
            else:
                out["subsets"] = self._chernoff_threshold(log_inv + _ROUNDING_SLACK)
        return out

    def threshold(self, level: float) -> tuple[float, str]:
        cache = self.__dict__.setdefault("_thresholds", {})
        if level not in cache:
            cache[level] = self.thresholds(level)
        ts = cache[level]
        best = min(ts, key=ts.get)
        return ts[best], best


_NULL_CACHE: dict[tuple, _NullL1] = {}


def _null_l1(sizes: Sequence[int], laws: Sequence[np.ndarray], bounds: Sequence[str]) -> _NullL1:
    """A cached :class:`_NullL1` (calibration runs and the engine meet the same laws and sizes again)."""
    key = (tuple(int(n) for n in sizes), tuple(np.asarray(l, dtype=np.float64).tobytes() for l in laws), tuple(bounds))
    null = _NULL_CACHE.get(key)
    if null is None:
        if len(_NULL_CACHE) > 256:
            _NULL_CACHE.clear()
        null = _NULL_CACHE[key] = _NullL1(sizes, laws, bounds)
    return null


def l1_threshold(strata_sizes: Sequence[int], expected: Sequence[np.ndarray], alpha: float,
                 bounds: Sequence[str] = L1_BOUNDS) -> float:
    """The value of ``S = sum_s ||c_s - n_s p_s||_1`` from which :func:`law_test` rejects at ``alpha``
    (``threshold_tv`` is this over ``2N``), for vectorised simulations of the test."""
    return _null_l1(strata_sizes, expected, bounds).threshold(alpha)[0]


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


def _power_threshold(strata_sizes: Sequence[int], vocab_size: int, power: float) -> float:
    """``t`` with ``P(||c - n r||_1 >= t) <= 1 - power`` for every true law ``r`` over ``vocab_size`` tokens."""
    n_total = float(sum(strata_sizes))
    m1 = sum(math.sqrt(n * (vocab_size - 1)) for n in strata_sizes)
    t_beta, _ = _threshold(n_total, m1, vocab_size * len(strata_sizes), 1.0 - power)
    return t_beta


def detectable_tv(strata_sizes: Sequence[int], vocab_size: int, expected: Sequence[np.ndarray] | None,
                  alpha: float, power: float = 0.99, *, bounds: Sequence[str] = L1_BOUNDS) -> float:
    """Smallest sample-weighted TV that :func:`law_test` rejects with probability ``>= power``.

    ``expected`` (the null laws) may be ``None``; then the worst case over null laws is used (the
    ``types`` and Jensen-``mcdiarmid`` bounds at the uniform law, whose terms dominate every law's).
    Proof: with ``t_a`` the test's threshold and ``t_b`` a bound with ``P(||c - n r||_1 >= t_b) <= 1 - power``
    for every true law ``r``, ``S >= 2 N TV(r, p) - ||c - n r||_1``, so ``TV >= (t_a + t_b) / (2N)``
    gives ``P(S >= t_a) >= power``.
    """
    n_total = float(sum(strata_sizes))
    if n_total == 0:
        return 1.0
    if expected is None:
        expected = [np.full(vocab_size, 1.0 / vocab_size)] * len(strata_sizes)
        bounds = tuple(b for b in bounds if b == "types") + ("mcdiarmid_jensen",)
    t_alpha, _ = _null_l1(strata_sizes, expected, bounds).threshold(alpha)
    t_beta = _power_threshold(strata_sizes, vocab_size, power)
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
        chi2 += float(((c - e) ** 2 / e).sum())  # Pearson
        seen = c > 0
        g += float(2.0 * (c[seen] * np.log(c[seen] / e[seen])).sum())  # G (log-likelihood ratio)
        dof += len(c) - 1
    if dof == 0:
        return None, 0, None, None, None
    return chi2, dof, float(chdtrc(dof, chi2)), g, float(chdtrc(dof, g))


def law_test(strata: Sequence[Stratum], alpha: float, power: float = 0.99, *,
             bounds: Sequence[str] = L1_BOUNDS) -> LawTestResult:
    """Test that every stratum's counts follow its expected law (the L1 / total-variation test).

    Assumptions: within a stratum the samples are i.i.d. from ``expected``; strata are independent
    given their sizes (sizes may depend on earlier, independent data). Under that null,
    ``P(pvalue <= a) <= a`` for every ``a`` and every sample size: false-failure rate at most
    ``alpha``. Power: against any true laws at sample-weighted TV ``>= tv_detectable`` it rejects
    with probability ``>= power`` (:func:`detectable_tv`). A sample on a token of expected
    probability zero is a ``support_violation`` and an exact failure.

    ``bounds`` picks the tail bounds (:data:`L1_BOUNDS`; :data:`L1_BOUNDS_LEGACY` is the first
    release's test, kept for comparisons).
    """
    strata = [s for s in strata if s.n > 0]
    if not strata:
        return LawTestResult(0.0, 1.0, 0, "types", 1.0, 1.0, 0)
    violations = sum(int(s.counts[s.expected <= 0].sum()) for s in strata)
    s_stat = sum(float(np.abs(s.counts - s.n * s.expected).sum()) for s in strata)
    sizes, laws = [s.n for s in strata], [s.expected for s in strata]
    null = _null_l1(sizes, laws, bounds)
    n_total = null.n_total
    t_alpha, bound = null.threshold(alpha)
    pvalue = null.pvalue(s_stat)
    vocab = len(strata[0].expected)
    t_beta = _power_threshold(sizes, vocab, power)
    tv_det = min(1.0, (t_alpha + t_beta) / (2.0 * n_total))
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


# ---------------------------------------------------------------------------------------------
# The likelihood-ratio (chi-square-family) test: Dirichlet-mixture e-values at a fixed sample size

#: Prior scales of the likelihood-ratio e-value: besides the Krichevsky-Trofimov prior
#: Dirichlet(1/2, ..., 1/2), one Dirichlet(kappa * n_s * p_s) prior per ``kappa`` (centred on the null
#: law, prior mass proportional to the stratum size), equal weights. Fixed before any data.
LR_SCALES: tuple[float, ...] = (1.0, 0.25, 1.0 / 16, 1.0 / 64)

#: Default share of ``alpha`` the verdict gives the L1 test (the rest goes to the likelihood ratio).
SHARE_L1 = 0.5


def dirichlet_log_evalue(counts, expected: np.ndarray, concentration=None) -> np.ndarray | float:
    """Log likelihood ratio of counts under a Dirichlet mixture against the exact law ``expected``.

    ``log E = log DirMult(c; a) - sum_x c_x log p(x)`` over the support of ``p`` (tokens outside it
    are ignored: they are exact failures, see ``support_violations``), where ``DirMult(c; a)`` is
    the probability of the observed sequence when its law is first drawn from Dirichlet(``a``):
    ``Gamma(A) / Gamma(n + A) * prod_x Gamma(c_x + a_x) / Gamma(a_x)``, ``A = sum a``.
    ``concentration=None`` is the Krichevsky-Trofimov prior ``a_x = 1/2``; a number ``A`` (or an array
    broadcast over the leading axes of ``counts``) is the prior ``a = A p``, centred on ``p``.

    Validity: for i.i.d. samples from ``p``, ``E[E] = int E_p[prod r(x_t) / p(x_t)] dPrior(r) = 1``,
    at every ``n``. ``counts`` may be a batch of shape ``(..., V)``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    support = expected > 0
    if support.sum() <= 1:
        return np.zeros(counts.shape[:-1]) if counts.ndim > 1 else 0.0
    c, p = counts[..., support], expected[support]
    n = c.sum(axis=-1)
    if concentration is None:
        a = np.full(p.shape, 0.5)
        a_total = np.asarray(0.5 * len(p))
    else:
        a = np.asarray(concentration, dtype=np.float64)[..., None] * p
        a_total = a.sum(axis=-1)
    log_marginal = gammaln(a_total) - gammaln(n + a_total) + (gammaln(c + a) - gammaln(a)).sum(axis=-1)
    out = log_marginal - (c * np.log(p)).sum(axis=-1)
    return out if np.ndim(out) else float(out)


def _lr_components(strata: Sequence[Stratum], scales: Sequence[float]) -> np.ndarray:
    """``log`` of each component's product e-value over the strata (KT first, then one per scale).

    Vectorised over strata (same vocabulary): the sums over a stratum run over the support of its law."""
    comps = np.zeros(1 + len(scales))
    strata = [s for s in strata if s.n > 0]
    if not strata:
        return comps
    counts = np.array([s.counts for s in strata], dtype=np.float64)
    laws = np.array([s.expected for s in strata], dtype=np.float64)
    mask = laws > 0
    counts = np.where(mask, counts, 0.0)
    n_inside = counts.sum(axis=1)
    keep = n_inside > 0
    counts, laws, mask, n_inside = counts[keep], laws[keep], mask[keep], n_inside[keep]
    safe_p = np.where(mask, laws, 1.0)
    log_lik = (counts * np.log(safe_p)).sum(axis=1)

    def log_marginal(a: np.ndarray) -> np.ndarray:  # a: (S, V) prior, 0 off the support
        a_total = a.sum(axis=1)
        safe_a = np.where(mask, a, 1.0)
        terms = np.where(mask, gammaln(counts + safe_a) - gammaln(safe_a), 0.0)
        return gammaln(a_total) - gammaln(n_inside + a_total) + terms.sum(axis=1)

    comps[0] = float((log_marginal(np.where(mask, 0.5, 0.0)) - log_lik).sum())
    for j, kappa in enumerate(scales):
        a = kappa * n_inside[:, None] * np.where(mask, laws, 0.0)
        comps[1 + j] = float((log_marginal(a) - log_lik).sum())
    return comps


def lr_log_evalue(strata: Sequence[Stratum], scales: Sequence[float] = LR_SCALES) -> float:
    """Log of the fixed-sample likelihood-ratio e-value of stratified counts against their exact laws.

    ``E = mean_j prod_s E_{s,j}``: component ``j`` uses one prior in every stratum (the
    Krichevsky-Trofimov prior, or Dirichlet(``kappa_j n_s p_s``) for ``kappa_j`` in ``scales``), and the
    product over strata pools their evidence. A prior may depend on ``p_s`` and ``n_s`` (it is fixed
    given the stratum sizes). Under the null (strata i.i.d. from their laws, independent given their
    sizes) ``E[E] <= 1``, so ``P(E >= 1/a) <= a`` for every ``a`` and every sample size (Markov).

    Why these priors: a prior centred on ``p_s`` gives a stratum of one sample the e-value 1 exactly, so
    many small strata cost nothing (no ``2^K`` here); its prior mass ``kappa n_s`` sets the scale of
    departures it bets on; the mixture over four scales costs at most ``log 5`` against the best one. The
    KT component carries the worst-case guarantee (:func:`lr_detectable_tv`).
    """
    comps = _lr_components([s for s in strata if s.n > 0], scales)
    return float(logsumexp(comps) - math.log(len(comps)))


def lr_log_evalue_batch(counts: np.ndarray, expected: np.ndarray, scales: Sequence[float] = LR_SCALES) -> np.ndarray:
    """:func:`lr_log_evalue` of one stratum for a batch of count vectors ``(R, V)`` (simulations)."""
    counts = np.asarray(counts)
    n = counts[..., np.asarray(expected) > 0].sum(axis=-1).astype(np.float64)
    comps = [np.asarray(dirichlet_log_evalue(counts, expected))]
    comps += [np.asarray(dirichlet_log_evalue(counts, expected, kappa * n)) for kappa in scales]
    comps = np.stack([np.broadcast_to(c, n.shape) for c in comps])
    return logsumexp(comps, axis=0) - math.log(len(comps))


def kt_regret(support_size: int, n) -> np.ndarray | float:
    """Bound on ``max_c [log max_r prod r^c - log KT(c)]`` for ``n`` samples on ``support_size`` tokens.

    ``(K - 1)/2 log n + log(Gamma(1/2)^K / Gamma(K/2))`` (Krichevsky-Trofimov; checked by enumeration
    of every count vector in the tests); 0 for ``K <= 1`` or ``n == 0``.
    """
    n = np.asarray(n, dtype=np.float64)
    k = support_size
    if k <= 1:
        return np.zeros(n.shape) if n.ndim else 0.0
    out = np.where(n > 0, (k - 1) / 2 * np.log(np.maximum(n, 1)) + k * gammaln(0.5) - gammaln(k / 2), 0.0)
    return out if out.ndim else float(out)


def lr_detectable_tv(strata_sizes: Sequence[int], vocab_size: int, expected: Sequence[np.ndarray] | None,
                     alpha: float, power: float = 0.99, scales: Sequence[float] = LR_SCALES) -> float:
    """Smallest sample-weighted TV that :func:`lr_test` rejects with probability ``>= power`` (a guarantee).

    Proof: ``E >= E_KT / J`` (``J`` components); ``log E_KT >= sum_s [n_s KL(rhat_s || p_s) - R_s]``
    (:func:`kt_regret`, ``rhat_s`` the empirical law, a sample outside the support being an exact
    failure anyway); Pinsker and Cauchy-Schwarz give ``sum_s n_s KL >= 2 N TV_w(rhat, p)^2``, and
    ``TV_w(rhat, p) >= TV_w(r, p) - ||c - n r||_1 / (2N)`` where the last term is below ``t_b / (2N)``
    with probability ``>= power`` (the same worst-case bound as :func:`detectable_tv`). Hence
    ``TV_w(r, p) >= t_b/(2N) + sqrt((log(1/alpha) + log J + sum_s R_s) / (2N))`` is detected.
    Usually larger than the L1 test's guarantee (the price of betting on rare-token departures).
    """
    n_total = float(sum(strata_sizes))
    if n_total == 0:
        return 1.0
    supports = [vocab_size] * len(strata_sizes) if expected is None else [int((e > 0).sum()) for e in expected]
    regret = sum(kt_regret(k, n) for k, n in zip(supports, strata_sizes))
    t_beta = _power_threshold(strata_sizes, vocab_size, power)
    need = max(0.0, math.log(1.0 / alpha) + math.log(1 + len(scales)) + regret)
    return min(1.0, t_beta / (2.0 * n_total) + math.sqrt(need / (2.0 * n_total)))


@dataclass(frozen=True)
class LRTestResult:
    """Result of :func:`lr_test`: ``statistic`` is ``log E``, ``pvalue = min(1, 1/E)``."""

    statistic: float
    pvalue: float
    n: int
    tv_detectable: float
    support_violations: int

    def rejects(self, alpha: float) -> bool:
        return self.support_violations > 0 or self.pvalue <= alpha


def lr_test(strata: Sequence[Stratum], alpha: float, power: float = 0.99,
            scales: Sequence[float] = LR_SCALES) -> LRTestResult:
    """The likelihood-ratio (chi-square-family) test of stratified counts against their exact laws.

    False-failure rate: ``P(pvalue <= a) <= a`` for every ``a`` and every sample size, under the
    assumptions of :func:`law_test` (Markov's inequality on the e-value :func:`lr_log_evalue`).
    Power: at least ``power`` against sample-weighted TV ``>= tv_detectable`` (:func:`lr_detectable_tv`),
    and far more against departures into rare tokens, where it needs a fraction of the L1 test's samples.
    """
    strata = [s for s in strata if s.n > 0]
    if not strata:
        return LRTestResult(0.0, 1.0, 0, 1.0, 0)
    violations = sum(int(s.counts[s.expected <= 0].sum()) for s in strata)
    log_e = lr_log_evalue(strata, scales)
    vocab = len(strata[0].expected)
    tv_det = lr_detectable_tv([s.n for s in strata], vocab, [s.expected for s in strata], alpha, power, scales)
    return LRTestResult(log_e, float(min(1.0, math.exp(-log_e))), sum(s.n for s in strata), tv_det, violations)


# ---------------------------------------------------------------------------------------------
# The verdict: L1 and likelihood ratio together


@dataclass(frozen=True)
class VerdictTestResult:
    """Result of :func:`verdict_test`: the fields of :class:`LawTestResult` (same names and meaning, the
    L1 ones for the L1 component at its share of alpha) plus the two components and which rejected."""

    statistic: float  # the sample-weighted TV distance
    pvalue: float  # combined, finite-sample valid: min(1, p_l1 / share_l1, p_lr / (1 - share_l1))
    n: int
    bound: str  # the L1 component's bound
    threshold_tv: float  # the L1 component rejects when statistic exceeds this
    tv_detectable: float  # combined guarantee: min(tv_detectable_l1, tv_detectable_lr)
    support_violations: int
    l1_pvalue: float
    lr_pvalue: float
    lr_log_evalue: float
    tv_detectable_l1: float
    tv_detectable_lr: float
    rejected_by: tuple[str, ...]  # at the alpha of the call: "support", "l1", "lr"
    alpha: float
    share_l1: float
    chi2: float | None = None
    chi2_dof: int = 0
    chi2_pvalue: float | None = None
    g: float | None = None
    g_pvalue: float | None = None

    def rejects(self, alpha: float) -> bool:
        return self.support_violations > 0 or self.pvalue <= alpha


def _check_share(share_l1: float) -> None:
    if not 0 < share_l1 < 1:
        raise ValueError("share_l1 must lie in (0, 1)")


def verdict_test(strata: Sequence[Stratum], alpha: float, power: float = 0.99,
                 share_l1: float = SHARE_L1) -> VerdictTestResult:
    """The verdict on one position: the L1 test and the likelihood-ratio test, ``alpha`` split between them.

    Assumptions (as :func:`law_test`): within a stratum the samples are i.i.d. from its ``expected`` law;
    strata are independent given their sizes (sizes may depend on earlier, independent data).

    - False-failure rate: ``P(pvalue <= a) <= a`` for every ``a`` and every sample size; in particular
      ``P(rejects(alpha)) <= alpha`` (union bound over the L1 test at ``share_l1 * alpha`` and the
      likelihood-ratio test at ``(1 - share_l1) * alpha``). A sample outside its law's support is an exact
      failure (``support_violations``), impossible under the null.
    - Power: against true laws at sample-weighted TV ``>= tv_detectable`` it rejects with probability
      ``>= power`` (the better of :func:`detectable_tv` at ``share_l1 * alpha`` and
      :func:`lr_detectable_tv` at the rest: the verdict rejects whenever either component does).
      Against mass moved into rare tokens, or mixed toward uniform, the likelihood ratio rejects with
      a fraction of the samples the L1 test needs (``benchmarks/power_table.py``).
    """
    _check_share(share_l1)
    strata = [s for s in strata if s.n > 0]
    a_l1, a_lr = share_l1 * alpha, (1.0 - share_l1) * alpha
    l1 = law_test(strata, a_l1, power)
    lr = lr_test(strata, a_lr, power)
    pvalue = float(min(1.0, l1.pvalue / share_l1, lr.pvalue / (1.0 - share_l1)))
    rejected = []
    if l1.support_violations:
        rejected.append("support")
    if l1.pvalue <= a_l1:
        rejected.append("l1")
    if lr.pvalue <= a_lr:
        rejected.append("lr")
    return VerdictTestResult(
        statistic=l1.statistic, pvalue=pvalue, n=l1.n, bound=l1.bound, threshold_tv=l1.threshold_tv,
        tv_detectable=min(l1.tv_detectable, lr.tv_detectable), support_violations=l1.support_violations,
        l1_pvalue=l1.pvalue, lr_pvalue=lr.pvalue, lr_log_evalue=lr.statistic,
        tv_detectable_l1=l1.tv_detectable, tv_detectable_lr=lr.tv_detectable,
        rejected_by=tuple(rejected), alpha=alpha, share_l1=share_l1,
        chi2=l1.chi2, chi2_dof=l1.chi2_dof, chi2_pvalue=l1.chi2_pvalue, g=l1.g, g_pvalue=l1.g_pvalue,
    )


def verdict_detectable_tv(strata_sizes: Sequence[int], vocab_size: int, expected: Sequence[np.ndarray] | None,
                          alpha: float, power: float = 0.99, share_l1: float = SHARE_L1) -> float:
    """:func:`verdict_test`'s ``tv_detectable`` before the data (``expected=None``: worst case over null laws)."""
    _check_share(share_l1)
    return min(detectable_tv(strata_sizes, vocab_size, expected, share_l1 * alpha, power),
               lr_detectable_tv(strata_sizes, vocab_size, expected, (1.0 - share_l1) * alpha, power))


def verdict_samples_for_tv(tv: float, vocab_size: int, alpha: float, power: float = 0.99,
                           share_l1: float = SHARE_L1) -> int:
    """Samples one stratum needs so that :func:`verdict_test` detects ``tv`` with probability ``>= power``
    (worst case over null laws of size ``vocab_size``): the smallest ``n`` with
    ``verdict_detectable_tv([n], ...) <= tv``."""
    if not 0 < tv <= 1:
        raise ValueError("tv must be in (0, 1]")
    hi = samples_for_tv(tv, vocab_size, share_l1 * alpha, power)
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if verdict_detectable_tv([mid], vocab_size, None, alpha, power, share_l1) <= tv:
            hi = mid
        else:
            lo = mid
    return hi
