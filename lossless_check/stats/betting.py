"""A sequential test-by-betting e-process aimed at the direction a q bug takes.

Observation ``t`` is an emitted token ``x_t`` whose null law (given everything before it) is the
target's processed law ``p_t``; ``q_t`` is the drafter's processed law at the same prefix, known
before ``x_t`` is seen. A q bug (wrong logits returned, a warper missing from q, ...) makes the
pair emit a law between ``p_t`` and the drafter's: tokens where ``q_t > p_t`` are over-represented.
The bet is the likelihood ratio of that alternative, ``(1 - eps) p_t + eps q_t``, against ``p_t``:

    E_t(eps) = prod_{s <= t} (1 - eps + eps q_s(x_s) / p_s(x_s)),

mixed with equal weights over :data:`EPSILONS` (a mixture of e-processes is one). Under the null
``E[q_t(x_t) / p_t(x_t)] = q_t(supp p_t) <= 1``, so each factor has mean at most 1 given the past:
``E_t`` is a nonnegative supermartingale with ``E_0 = 1`` and by Ville's inequality
``P(exists t: E_t >= 1/alpha) <= alpha``. It is valid whatever ``q_t`` is (it only aims the bet) and
needs no independence between tokens: the chain rule makes every emitted token one observation,
even when prefixes repeat. A token with ``p_t(x_t) = 0`` is an exact failure, counted apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

#: Bet sizes, fixed before any data: from "the pair emits the drafter's law" to a 1/64 contamination.
EPSILONS: tuple[float, ...] = (1.0, 0.5, 0.25, 1 / 8, 1 / 16, 1 / 32, 1 / 64)


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
        return cls(np.zeros(len(EPSILONS)))

    @property
    def log_evalue(self) -> float:
        return float(logsumexp(self.log_wealth) - math.log(len(EPSILONS)))

    def update(self, p_x: float, q_x: float, alpha: float) -> None:
        """Bet on one emitted token with null probability ``p_x`` and drafter probability ``q_x``."""
        self.tokens += 1
        if p_x <= 0.0:
            self.support_violations += 1
            return
        eps = np.asarray(EPSILONS)
        with np.errstate(divide="ignore"):
            self.log_wealth = self.log_wealth + np.log(1.0 - eps + eps * (q_x / p_x))
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
    ``(1 - c) p + c q`` (per-position TV ``c * TV(p, q)`` to the null), else from ``p``, and bets as
    the real run does. ``power(c, f)`` is the share of replicates whose e-value reached ``1/alpha``
    within the run's tokens: the departure toward q (the direction of a q bug) of that size, at that
    share of positions, is detected with that probability.
    """

    def __init__(self, alpha: float, seed: int):
        self.threshold = math.log(1.0 / alpha)
        self.rng = np.random.default_rng([seed, 7])
        shape = (len(CONTAMINATIONS), len(FRACTIONS), REPLICATES)
        self.log_wealth = np.zeros(shape + (len(EPSILONS),))
        self.detected_at = np.full(shape, -1)
        self.tokens = 0
        self.tv_pq: list[float] = []

    def observe(self, p: np.ndarray, q: np.ndarray) -> None:
        self.tokens += 1
        self.tv_pq.append(0.5 * float(np.abs(p - q).sum()))
        eps = np.asarray(EPSILONS)
        under_null = self.rng.choice(p.size, REPLICATES, p=p / p.sum())
        for i, c in enumerate(CONTAMINATIONS):
            mixed = (1.0 - c) * p + c * q
            under_alt = self.rng.choice(p.size, REPLICATES, p=mixed / mixed.sum())
            for j, f in enumerate(FRACTIONS):
                x = np.where(self.rng.random(REPLICATES) < f, under_alt, under_null)
                ratio = q[x] / np.maximum(p[x], 1e-300)
                with np.errstate(divide="ignore"):
                    self.log_wealth[i, j] += np.log(1.0 - eps[None] + eps[None] * ratio[:, None])
        log_e = logsumexp(self.log_wealth, axis=-1) - math.log(len(EPSILONS))
        fresh = (log_e >= self.threshold) & (self.detected_at < 0)
        self.detected_at[fresh] = self.tokens

    def summary(self) -> list[dict]:
        """One row per alternative: contamination, fraction of positions, median per-position TV at the
        hit positions (``c`` times the median TV(p, q) met), power, median tokens to detection."""
        median_tv = float(np.median(self.tv_pq)) if self.tv_pq else 0.0
        rows = []
        for i, c in enumerate(CONTAMINATIONS):
            for j, f in enumerate(FRACTIONS):
                hit = self.detected_at[i, j] > 0
                rows.append({"contamination": c, "fraction_of_positions": f, "median_tv_at_hit_positions": c * median_tv,
                             "power": float(hit.mean()), "tokens": self.tokens,
                             "median_tokens_to_detection": float(np.median(self.detected_at[i, j][hit])) if hit.any()
                             else None})
        return rows


__all__ = ["BettingState", "CONTAMINATIONS", "EPSILONS", "FRACTIONS", "PowerSimulation"]
