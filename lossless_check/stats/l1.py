"""The L1 (total-variation) test: finite-sample tail bounds on the L1 distance (see the package docstring)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize
from scipy.special import bdtrc, gammaln

from lossless_check.stats.diagnostics import _chi2_diagnostics
from lossless_check.stats.strata import Stratum


#: Supports up to this size have their token sets enumerated by the ``subsets`` bound.
MAX_ENUMERATED_SUPPORT = 12

#: The ``subsets`` bound is computed for at most this many strata (beyond, ``mcdiarmid`` wins anyway:
#: each stratum costs the union bound about ``|supp| log 2``). A function of the stratum count only.
MAX_SUBSET_STRATA = 64

#: The L1 tail bounds :func:`law_test` takes the best of, and the two the first release used.
L1_BOUNDS: tuple[str, ...] = ("types", "mcdiarmid", "subsets")
L1_BOUNDS_LEGACY: tuple[str, ...] = ("types", "mcdiarmid_jensen")



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

