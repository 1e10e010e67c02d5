"""E-values: the anytime Krichevsky-Trofimov mixture and the fixed-sample likelihood-ratio test."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp

from lossless_check.stats.l1 import _power_threshold
from lossless_check.stats.strata import Stratum

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


# ---------------------------------------------------------------------------------------------
# The likelihood-ratio (chi-square-family) test: Dirichlet-mixture e-values at a fixed sample size

#: Prior scales of the likelihood-ratio e-value: besides the Krichevsky-Trofimov prior
#: Dirichlet(1/2, ..., 1/2), one Dirichlet(kappa * n_s * p_s) prior per ``kappa`` (centred on the null
#: law, prior mass proportional to the stratum size), equal weights. Fixed before any data.
LR_SCALES: tuple[float, ...] = (1.0, 0.25, 1.0 / 16, 1.0 / 64)



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

