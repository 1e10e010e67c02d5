"""A sequential test by betting that emitted tokens follow the verifier's own law, with power in every direction.

**The data.** Observation ``t`` is an emitted token ``x_t``. Before it is seen, the harness holds

- ``p_t``: the null law, the verifier's law at that position (``lossless-check models`` takes it from the
  very ``generate()`` call that emitted the token: :mod:`lossless_check.modes.models.sampling`);
- ``q_t`` and ``r_t``: two laws that only aim bets (the drafter's processed law at the prefix, and the law a
  named bug class would emit there); any laws work, computed from anything known before ``x_t``;
- ``V_t``: a Uniform(0, 1) number the harness draws, independent of ``x_t`` and of everything before it.

**The hypothesis.** Let ``H_{t-1}`` be the sigma-field of ``x_s, V_s`` for ``s < t`` and of ``p_s, q_s, r_s``
for ``s <= t`` (what the test has seen before ``x_t``). The null ``H0``: for every ``t``,
``P(x_t = x | H_{t-1}) = p_t(x)``: each emitted token follows the verifier's law given all the test has seen.

**The bets.** Each factor below is a function of ``x_t``, ``V_t`` and ``H_{t-1}``-measurable quantities, is
``>= 0``, and has conditional mean exactly 1 under ``H0``:

- *statistic bets* ``1 + eps g(x_t)``, ``g = (w - mu) / s``, ``mu = E_{p_t}[w]`` (so ``E[g] = 0``), scaled so
  ``g >= -1`` (then ``1 + eps g >= 1 - eps > 0`` for ``eps`` in :data:`EPSILONS`): *toward q* (``w`` one of
  ``1[q > p]``, ``min(q/p, 2)``, ``min(q/p, 8)``, ``q/p``, ``r/p``; ``s = mu``, as ``w >= 0``), *sharper*
  (``w = p(x)``, ``s = mu``: the emitted token is likelier under ``p`` than ``p``'s own tokens are, as under a
  lower temperature) and *flatter* (``w = -p(x)``, centred, ``s = max p - mu``: the reverse);
- *PIT bets*: order the vocabulary by ``p_t`` descending (ties by token id), ``F`` the cumulative mass along
  that order; ``U_t = F(x_t-) + V_t p_t(x_t)`` is exactly Uniform(0, 1) given ``H_{t-1}``, so the ``U_t`` are
  i.i.d. uniform. On ``B`` equal bins, the Krichevsky-Trofimov plug-in density ``f_t(b) = B (n_b + 1/2) /
  (t - 1 + B/2)`` (``n_b``: earlier ``U`` in bin ``b``) has mean ``sum_b f_t(b) / B = 1``; the product is the
  Dirichlet(1/2) mixture of i.i.d. histogram likelihood ratios against the uniform. ``B`` in
  :data:`RESOLUTIONS`, and a second PIT with the vocabulary ordered by ``q/p`` descending, ties by token id (a
  departure toward or away from ``q`` moves ``U`` toward 0 or 1).

A temperature change moves the law by a ratio monotone in ``p`` (so in the order), and so does a mixture
with the rank-reversed law: ``U``'s law is then at the same total variation from the uniform as the token's
law is from ``p``; a tilt toward (or away from) ``q``, ``p (q/p)^b``, is monotone in ``q/p``.

**Validity.** Each family's e-process ``E_t = prod_{s <= t} factor_s`` is a nonnegative ``H``-martingale with
``E_0 = 1`` (a test martingale); the e-value is an average of them with weights fixed before any data
(:data:`FAMILIES`, equal weight; equal weight within a family), itself a test martingale, so by Ville's
inequality ``P_H0(exists t: E_t >= 1/alpha) <= alpha``: the test may look after every token and stop at its
first rejection, or at any time for any reason. It needs no independence between tokens and no knowledge of
how ``q`` or ``r`` were computed. A token with ``p_t(x_t) = 0`` is an exact failure, counted apart.

**What "at most alpha" assumes.** ``H0`` itself, with torch's random generator (which drew the tokens) and
numpy's (which draws ``V``) modelled as independent ideal uniform sources; and float64 arithmetic on ``p``
exact (the factors' means are 1 up to float64 rounding, about ``1e-16`` per token). Why a lossless decoder
satisfies ``H0`` with ``p`` the verifier's rows: :mod:`lossless_check.modes.models.sampling`.

**Power**: measured on the laws a run met, by simulation (:mod:`lossless_check.stats.power`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import gammaln, logsumexp

#: Bet sizes of the statistic bets, fixed before any data.
EPSILONS: tuple[float, ...] = (0.9, 0.5, 0.25, 1 / 8, 1 / 16, 1 / 32, 1 / 64)
#: Caps of ``min(q/p, cap)`` in the toward-q family (``0``: the indicator ``1[q > p]``; ``inf``: the ratio
#: itself); then the aimed law's ratio ``r/p``.
STATISTICS: tuple[float, ...] = (0.0, 2.0, 8.0, math.inf)
#: Bin counts of the PIT bets.
RESOLUTIONS: tuple[int, ...] = (2, 4, 8, 16, 32)
#: The families of the mixture, each of weight ``1 / len(FAMILIES)``.
FAMILIES: tuple[str, ...] = ("toward_q", "sharper", "flatter", "pit_by_p", "pit_by_q_over_p")
#: Statistic bets: the toward-q statistics (with ``r/p``), then sharper and flatter.
_STATISTIC_BETS = len(STATISTICS) + 1 + 2
#: Log factors of the statistic bets per token.
FIXED = _STATISTIC_BETS * len(EPSILONS)
#: One token's observation: the statistic bets' log factors, then its two PIT values.
OBSERVATION = FIXED + 2


class PositionBets:
    """The bets of one position (null law ``p``, aiming laws ``q`` and ``aimed``) on the support of ``p``.

    Tokens are addressed by their index in :attr:`support` (``np.flatnonzero(p > 0)``)."""

    def __init__(self, p: np.ndarray, q: np.ndarray, aimed: np.ndarray):
        self.support = np.flatnonzero(p > 0)
        ps, qs, rs = p[self.support], q[self.support], aimed[self.support]
        self.p = ps
        ratio = qs / ps
        scaled = []
        for w in ([(qs > ps).astype(np.float64)] + [np.minimum(ratio, cap) for cap in STATISTICS[1:]]
                  + [rs / ps]):
            mu = float(ps @ w)
            # A statistic with mu = 0 is 0 on the whole support: no bet.
            scaled.append((w - mu) / mu if mu > 0 else np.zeros_like(w))
        square = float(ps @ ps)
        top = float(ps.max())
        scaled.append((ps - square) / square)
        scaled.append((square - ps) / (top - square) if top > square else np.zeros_like(ps))
        self.scaled = np.array(scaled)  # (_STATISTIC_BETS, support)
        self.starts = np.empty((2, ps.size))  # F(x-) along each order
        for row, order in enumerate((np.argsort(-ps, kind="stable"), np.argsort(-ratio, kind="stable"))):
            self.starts[row, order] = np.concatenate(([0.0], np.cumsum(ps[order])[:-1]))

    def observe(self, index: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Observations ``(len(index), OBSERVATION)`` of the tokens at support indices ``index``, with the
        uniforms ``v`` of their PIT values."""
        if index.size > self.p.size:  # many tokens of a small support: tabulate the support once
            log_factors = self._log_factors(np.arange(self.p.size))[index]
        else:
            log_factors = self._log_factors(index)
        pit = self.starts[:, index].T + (v * self.p[index])[:, None]
        return np.concatenate([log_factors, np.minimum(pit, 1.0)], axis=1)

    def _log_factors(self, index: np.ndarray) -> np.ndarray:
        g = self.scaled[:, index].T  # (n, statistics)
        return np.log1p(g[:, :, None] * np.asarray(EPSILONS)).reshape(len(index), FIXED)

    def index(self, token: int) -> int:
        """The support index of ``token`` (which must have positive probability)."""
        return int(np.searchsorted(self.support, token))


def observe_token(p: np.ndarray, q: np.ndarray, aimed: np.ndarray, token: int, v: float) -> np.ndarray | None:
    """One emitted ``token``'s observation (``None``: outside the support of ``p``, an exact failure)."""
    if not p[token] > 0.0:
        return None
    bets = PositionBets(p, q, aimed)
    return bets.observe(np.array([bets.index(token)]), np.array([v]))[0]


class EProcess:
    """The running e-processes of the mixture, for a batch of independent streams of shape ``shape``."""

    def __init__(self, shape: tuple = ()):
        self.log_fixed = np.zeros(shape + (FIXED,))
        self.counts = [np.zeros(shape + (2, b)) for b in RESOLUTIONS]

    def add(self, log_fixed: np.ndarray, pit: np.ndarray) -> None:
        """Add tokens: ``log_fixed`` the sum of their statistic bets' log factors ``(*shape, FIXED)``,
        ``pit`` their PIT values ``(*shape, n, 2)``."""
        self.log_fixed = self.log_fixed + log_fixed
        # Each stream's PIT values, counted into its own row of bins.
        streams = np.arange(pit[..., 0, :].size).reshape(pit[..., 0, :].shape)  # (*shape, 2)
        for b, counts in zip(RESOLUTIONS, self.counts):
            bins = np.minimum((pit * b).astype(np.int64), b - 1)  # (*shape, n, 2)
            flat = (streams[..., None, :] * b + bins).ravel()
            counts += np.bincount(flat, minlength=streams.size * b).reshape(counts.shape)

    def family_log_evalues(self) -> np.ndarray:
        """``(*shape, len(FAMILIES))``: each family's log e-value."""
        fixed = self.log_fixed.reshape(self.log_fixed.shape[:-1] + (_STATISTIC_BETS, len(EPSILONS)))
        n_toward = len(STATISTICS) + 1
        toward = logsumexp(fixed[..., :n_toward, :].reshape(fixed.shape[:-2] + (-1,)), axis=-1)
        families = [toward - math.log(n_toward * len(EPSILONS)),
                    logsumexp(fixed[..., n_toward, :], axis=-1) - math.log(len(EPSILONS)),
                    logsumexp(fixed[..., n_toward + 1, :], axis=-1) - math.log(len(EPSILONS))]
        kt = np.stack([_kt_log_wealth(counts, b) for b, counts in zip(RESOLUTIONS, self.counts)], axis=-1)
        families += list(np.moveaxis(logsumexp(kt, axis=-1) - math.log(len(RESOLUTIONS)), -1, 0))
        return np.stack(families, axis=-1)

    def log_evalue(self) -> np.ndarray:
        """``(*shape)``: the mixture's log e-value."""
        return logsumexp(self.family_log_evalues(), axis=-1) - math.log(len(FAMILIES))


def _kt_log_wealth(counts: np.ndarray, bins: int) -> np.ndarray:
    """``log prod_t f_t(b_t)`` of the Krichevsky-Trofimov bet, a function of the final bin counts only:
    ``n log B + sum_b log (Gamma(n_b + 1/2) / Gamma(1/2)) - log (Gamma(n + B/2) / Gamma(B/2))``."""
    n = counts.sum(axis=-1)
    return (n * math.log(bins) + (gammaln(counts + 0.5) - gammaln(0.5)).sum(axis=-1)
            - gammaln(n + bins / 2) + gammaln(bins / 2))


@dataclass
class BettingState:
    """The e-value of one run, token by token; ``rejected_at`` is the first token where it reached
    ``1/alpha``."""

    process: EProcess = field(default_factory=EProcess)
    tokens: int = 0
    support_violations: int = 0
    log_evalue: float = 0.0
    max_log_evalue: float = 0.0
    rejected_at: int | None = None

    @classmethod
    def start(cls) -> BettingState:
        return cls()

    def add(self, observation: np.ndarray | None, alpha: float) -> None:
        """Add one token's observation (a row of :meth:`PositionBets.observe`; ``None``: the token has
        probability 0 under its null law)."""
        self.tokens += 1
        if observation is None:
            self.support_violations += 1
            return
        self.process.add(observation[:FIXED], observation[None, FIXED:])
        self.log_evalue = float(self.process.log_evalue())
        self.max_log_evalue = max(self.max_log_evalue, self.log_evalue)
        if self.rejected_at is None and self.log_evalue >= math.log(1.0 / alpha):
            self.rejected_at = self.tokens

    def update(self, p: np.ndarray, q: np.ndarray, aimed: np.ndarray, token: int, v: float, alpha: float) -> None:
        """Bet on one emitted ``token`` with null law ``p``, aiming laws ``q`` and ``aimed``, PIT uniform ``v``."""
        self.add(observe_token(p, q, aimed, token, v), alpha)

    def family_log_evalues(self) -> dict:
        return dict(zip(FAMILIES, (float(x) for x in self.process.family_log_evalues())))


__all__ = ["EPSILONS", "FAMILIES", "FIXED", "OBSERVATION", "RESOLUTIONS", "STATISTICS", "BettingState", "EProcess",
           "PositionBets", "observe_token"]
