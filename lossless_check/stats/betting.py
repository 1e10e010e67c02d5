"""A sequential test-by-betting e-process aimed at the direction a q bug takes.

Observation ``t`` is an emitted token ``x_t`` whose null law (given everything before it) is the
target's processed law ``p_t``; ``q_t`` is the drafter's processed law at the same prefix, known
before ``x_t`` is seen. A q bug (raw logits returned under a truncating warper, a warper missing
from q, ...) makes the pair over-represent tokens where ``q_t > p_t``, but only by a bounded factor
(raw logits under ``top_k``: at most ``1/Z``, ``Z`` the drafter's mass on its top k): betting the full
likelihood ratio ``q/p`` alone loses on the rare tokens where it is huge. So the bets are on several
statistics ``w`` of the token, most of them bounded, each centred by its exact null mean ``mu = E_p[w]``:

    E_t(w, eps) = prod_{s <= t} (1 + (eps / mu_s) (w_s(x_s) - mu_s)),   w in STATISTICS, eps in EPSILONS,

``w`` one of ``1[q > p]``, ``min(q/p, 2)``, ``min(q/p, 8)``, ``q/p``, and ``r/p`` for a law ``r`` on the
support of ``p`` that a named bug class would emit at that prefix (computed from the laws alone, before
the token is seen: the pair's raw-logits law, :func:`lossless_check.modes.models.pair.raw_logits_law`); the
e-value is the equal-weight mixture of all of them (a mixture of e-processes is one). Each factor is
``>= 1 - eps >= 0`` and has mean exactly 1 under the null, so ``E_t`` is a nonnegative martingale and,
by Ville's inequality, ``P(exists t: E_t >= 1/alpha) <= alpha``. It is valid whatever ``q_t`` is (q only
aims the bet) and needs no independence between tokens: by the chain rule every emitted token is one observation,
even where prefixes repeat. A token with ``p_t(x_t) = 0`` is an exact failure, counted apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

#: Bet sizes, fixed before any data.
EPSILONS: tuple[float, ...] = (0.9, 0.5, 0.25, 1 / 8, 1 / 16, 1 / 32, 1 / 64)
#: Caps of ``min(q/p, cap)`` (``0``: the indicator ``1[q > p]``; ``inf``: the ratio itself); then the
#: bug-class law's ratio ``r/p``.
STATISTICS: tuple[float, ...] = (0.0, 2.0, 8.0, math.inf)
COMPONENTS = (len(STATISTICS) + 1) * len(EPSILONS)


def log_factors(p: np.ndarray, q: np.ndarray, tokens: np.ndarray, aimed: np.ndarray) -> np.ndarray:
    """``log`` of every bet's factor ``(len(tokens), COMPONENTS)`` for ``tokens`` emitted at one position
    (``aimed``: the bug-class law ``r`` at that prefix; ``p`` itself bets nothing with it)."""
    inside = p > 0
    safe_p = np.where(inside, p, 1.0)
    ratio = np.where(inside, q / safe_p, 0.0)
    rows, means = [], []
    for w in [(q > p).astype(np.float64)] + [np.minimum(ratio, cap) for cap in STATISTICS[1:]] + \
             [np.where(inside, aimed / safe_p, 0.0)]:
        rows.append(w[tokens])
        means.append(float((p * w).sum()))
    w_x, mu = np.array(rows).T, np.array(means)  # (n, S), (S,)
    eps = np.asarray(EPSILONS)
    with np.errstate(divide="ignore", invalid="ignore"):
        # A statistic with mu = 0 is 0 on the whole support: its factor is 1 (no bet).
        scaled = np.where(mu > 0, (w_x - mu) / np.where(mu > 0, mu, 1.0), 0.0)  # (n, S)
        return np.log1p(scaled[:, :, None] * eps[None, None, :]).reshape(len(tokens), -1)


@dataclass
class BettingState:
    """The running log wealth of every bet size; ``log_evalue`` is the mixture's."""

    log_wealth: np.ndarray
    tokens: int = 0
    support_violations: int = 0
    max_log_evalue: float = 0.0
    rejected_at: int | None = None  # the token count where ``log_evalue`` first reached ``log(1/alpha)``

    @classmethod
    def start(cls) -> "BettingState":
        return cls(np.zeros(COMPONENTS))

    @property
    def log_evalue(self) -> float:
        return float(logsumexp(self.log_wealth) - math.log(COMPONENTS))

    def update(self, p: np.ndarray, q: np.ndarray, aimed: np.ndarray, token: int, alpha: float) -> None:
        """Bet on one emitted ``token`` with null law ``p``, drafter law ``q`` and bug-class law ``aimed``
        at its prefix."""
        self.add(log_factors(p, q, np.array([token]), aimed)[0] if p[token] > 0.0 else None, alpha)

    def add(self, factors: np.ndarray | None, alpha: float) -> None:
        """Add one token's log factors (a row of :func:`log_factors`, computed wherever the token was
        observed); ``None``: the token has probability 0 under its null law."""
        self.tokens += 1
        if factors is None:
            self.support_violations += 1
            return
        self.log_wealth = self.log_wealth + factors
        log_e = self.log_evalue
        self.max_log_evalue = max(self.max_log_evalue, log_e)
        if self.rejected_at is None and log_e >= math.log(1.0 / alpha):
            self.rejected_at = self.tokens


#: The simulated alternatives of :class:`PowerSimulation`: contamination toward q, and the fraction of
#: positions it hits (fixed before any data).
CONTAMINATIONS: tuple[float, ...] = (1.0, 0.5, 0.25, 0.1)
FRACTIONS: tuple[float, ...] = (1.0, 0.25)
REPLICATES = 100


class PowerSimulation:
    """The power of :class:`BettingState` on the laws a run actually met, by Monte Carlo.

    At every observed position (null law ``p``, drafter law ``q``), each of :data:`REPLICATES`
    simulated runs per alternative ``(c, f)`` emits, with probability ``f``, a token from
    ``(1 - c) p + c q'``, ``q'`` the drafter's law restricted to the support of ``p`` (a token outside it
    is an exact failure, not a statistical one), at per-position TV ``c * TV(p, q')`` to the null, else
    from ``p``, and bets as the real run does. ``power(c, f)`` is the share of replicates whose e-value
    reached ``1/alpha`` within the run's tokens: the departure toward q (the direction of a q bug) of
    that size, at that share of positions, is detected with that probability.
    """

    def __init__(self, alpha: float):
        self.threshold = math.log(1.0 / alpha)
        shape = (len(CONTAMINATIONS), len(FRACTIONS), REPLICATES)
        self.log_wealth = np.zeros(shape + (COMPONENTS,))
        self.detected_at = np.full(shape, -1)
        self.tokens = 0
        self.tv_pq: list[float] = []

    @staticmethod
    def step(p: np.ndarray, q: np.ndarray, aimed: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, float]:
        """One observed position's simulated log factors (every alternative and replicate), drawn with
        ``rng``, and ``TV(p, q')``: computed where the position was observed, added in order by :meth:`add`."""
        inside = np.where(p > 0, q, 0.0)
        toward = inside / inside.sum() if inside.sum() > 0 else p
        under_null = rng.choice(p.size, REPLICATES, p=p / p.sum())
        increments = np.empty((len(CONTAMINATIONS), len(FRACTIONS), REPLICATES, COMPONENTS))
        for i, c in enumerate(CONTAMINATIONS):
            mixed = (1.0 - c) * p + c * toward
            under_alt = rng.choice(p.size, REPLICATES, p=mixed / mixed.sum())
            for j, f in enumerate(FRACTIONS):
                x = np.where(rng.random(REPLICATES) < f, under_alt, under_null)
                increments[i, j] = log_factors(p, q, x, aimed)
        return increments, 0.5 * float(np.abs(p - toward).sum())

    def add(self, increments: np.ndarray, tv: float) -> None:
        """Add one position's :meth:`step`."""
        self.tokens += 1
        self.tv_pq.append(tv)
        self.log_wealth += increments
        log_e = logsumexp(self.log_wealth, axis=-1) - math.log(COMPONENTS)
        fresh = (log_e >= self.threshold) & (self.detected_at < 0)
        self.detected_at[fresh] = self.tokens

    def summary(self) -> list[dict]:
        """One row per alternative: contamination, fraction of positions, median per-position TV at the
        hit positions (``c`` times the median ``TV(p, q')`` met), power, median tokens to detection."""
        median_tv = float(np.median(self.tv_pq)) if self.tv_pq else 0.0
        rows = []
        for i, c in enumerate(CONTAMINATIONS):
            for j, f in enumerate(FRACTIONS):
                hit = self.detected_at[i, j] > 0
                rows.append({"contamination": c, "fraction_of_positions": f,
                             "median_tv_at_hit_positions": c * median_tv,
                             "power": float(hit.mean()), "tokens": self.tokens,
                             "median_tokens_to_detection": float(np.median(self.detected_at[i, j][hit])) if hit.any()
                             else None})
        return rows


__all__ = ["BettingState", "CONTAMINATIONS", "EPSILONS", "FRACTIONS", "PowerSimulation", "STATISTICS", "log_factors"]
