"""The power of the betting e-process (:mod:`lossless_check.stats.betting`) on the laws a run met, by simulation.

At every observed position, each simulated replicate emits a token from a law at a stated per-position total
variation from the null law, in a stated direction (:func:`departures`), and bets as the real run does;
:class:`PowerSimulation` folds the replicates call by call and states, per direction and size, the share that
rejected, the smallest size caught with power :data:`TARGET_POWER` in every direction, and about how many tokens
a size would take. Checked against a brute-force simulation that shares no code with it
(``tests/test_betting.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp
from scipy.stats import norm

from lossless_check.stats.betting import FAMILIES, FIXED, OBSERVATION, EProcess, PositionBets

#: The simulated departures of :class:`PowerSimulation`. ``toward_q``: ``p`` tilted by ``(q/p)^b``, ``b > 0``
#: (``b = 1``: ``q`` on the support of ``p``; beyond: further the same way; ``log(q/p)`` clipped to +-20);
#: ``away_from_q``: tilted by ``(p/q)^b`` (over-representing where the drafter is short of the target, as a
#: drafter sampling its raw law while returning its processed one does); ``sharper`` / ``flatter``: ``p`` at a
#: temperature below / above 1; ``reversed_rank``:
#: along ``rev(p) - p`` (the probabilities of the support in reverse order of rank); ``permuted``: along
#: ``perm(p) - p``, a fresh random permutation of the support's probabilities at each position.
DIRECTIONS: tuple[str, ...] = ("toward_q", "away_from_q", "sharper", "flatter", "reversed_rank", "permuted")
#: Per-position total variations of the simulated departures.
SIZES: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.3)
REPLICATES = 100
#: Power that counts as "would have seen it".
TARGET_POWER = 0.99


def departures(p: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``(len(DIRECTIONS), len(SIZES), support)``: for every direction and size, the law on the support of
    ``p`` (``np.flatnonzero(p > 0)``) at that total variation from ``p`` in that direction, or the farthest
    law the direction reaches there when it cannot go as far (``permuted`` draws its permutation with ``rng``)."""
    support = np.flatnonzero(p > 0)
    ps = p[support]
    ranked = np.argsort(-ps, kind="stable")
    sizes = np.asarray(SIZES)
    laws = np.empty((len(DIRECTIONS), len(SIZES), ps.size))
    for i, direction in enumerate(DIRECTIONS):
        if direction in ("toward_q", "away_from_q"):
            # log(q/p), clipped to +-20 so a token q gives 0 tilts at a finite rate.
            log_ratio = np.clip(np.log(np.maximum(q[support] / ps, 1e-300)), -_LOG_RATIO_CAP, _LOG_RATIO_CAP)
            laws[i] = _tilted(ps, log_ratio if direction == "toward_q" else -log_ratio, sizes, sharper=True)
            continue
        if direction in ("sharper", "flatter"):
            laws[i] = _tilted(ps, np.log(ps), sizes, sharper=direction == "sharper")
            continue
        target = np.empty_like(ps)
        if direction == "reversed_rank":
            target[ranked] = ps[ranked][::-1]
        else:  # permuted
            target[ranked] = ps[ranked][rng.permutation(ps.size)]
        step = target - ps
        tv = 0.5 * float(np.abs(step).sum())
        if tv == 0.0:
            laws[i] = ps
            continue
        falling = step < 0
        # p + c (target - p) stays a law for c up to min p / (p - target) over the tokens it lowers.
        c = np.minimum(sizes / tv, float(np.min(ps[falling] / -step[falling])))
        laws[i] = np.maximum(ps + c[:, None] * step, 0.0)
    return laws


#: Bisection steps of the tilted departures (a relative precision of about 1e-4 on ``1 + b``).
_BISECTION_STEPS = 16
_LOG_RATIO_CAP = 20.0


def _tilted(ps: np.ndarray, z: np.ndarray, sizes: np.ndarray, sharper: bool) -> np.ndarray:
    """``(len(sizes), support)``: ``ps exp(b z)`` normalised at total variation ``size`` from ``ps``, by
    bisection on the exponent: ``b`` in ``[0, 63]`` (on ``log2(1 + b)``; with ``z = log p``, the temperature
    ``1 / (1 + b)``, sharper) or ``b`` in ``[-1, 0]`` (``z = log p``: flatter, ``b = -1`` the uniform law); the
    extreme exponent when that does not reach it."""
    z = z - z.max()

    def laws(b: np.ndarray) -> np.ndarray:
        e = ps * np.exp(b[:, None] * z[None, :])
        return e / e.sum(axis=1, keepdims=True)

    def tv(b: np.ndarray) -> np.ndarray:
        return 0.5 * np.abs(laws(b) - ps).sum(axis=1)

    to_exponent = (lambda x: 2.0 ** x - 1.0) if sharper else (lambda x: x)
    near, far = (np.zeros_like(sizes), np.full_like(sizes, 6.0)) if sharper else (np.zeros_like(sizes),
                                                                                     np.full_like(sizes, -1.0))
    reachable = tv(to_exponent(far)) > sizes
    for _ in range(_BISECTION_STEPS):
        middle = 0.5 * (near + far)
        # TV grows as the exponent moves away from 0, on either side.
        beyond = tv(to_exponent(middle)) > sizes
        far = np.where(beyond & reachable, middle, far)
        near = np.where(beyond | ~reachable, near, middle)
    return laws(to_exponent(far))


@dataclass
class PowerCall:
    """The simulated replicates over one call's positions (computed where the call ran, folded in order by
    :meth:`PowerSimulation.add`): summed statistic-bet log factors, the PIT values, the departures' TVs."""

    log_fixed: np.ndarray = None  # (directions, sizes, replicates, FIXED)
    pit: list = field(default_factory=list)  # per position (directions, sizes, replicates, 2)
    tv: list = field(default_factory=list)  # per position (directions, sizes)
    replicates: int = REPLICATES

    def add(self, p: np.ndarray, q: np.ndarray, aimed: np.ndarray, rng: np.random.Generator) -> None:
        """Simulate :attr:`replicates` tokens at one position (null ``p``, aiming laws ``q``, ``aimed``) under
        every departure, drawn with ``rng``."""
        bets = PositionBets(p, q, aimed)
        laws = departures(p, q, rng)
        tv = 0.5 * np.abs(laws - bets.p).sum(axis=-1)
        shape = (len(DIRECTIONS), len(SIZES), self.replicates)
        # Inverse-CDF draws (the law of rng.choice), one sorted search per law.
        cumulative = np.cumsum(laws, axis=-1)
        u = rng.random(shape) * cumulative[..., -1:]
        index = np.empty(shape, dtype=np.int64)
        for i, j in np.ndindex(*shape[:2]):
            index[i, j] = np.searchsorted(cumulative[i, j], u[i, j], side="right")
        index = np.minimum(index, bets.p.size - 1)
        observations = bets.observe(index.ravel(), rng.random(index.size)).reshape(shape + (OBSERVATION,))
        fixed = observations[..., :FIXED]
        self.log_fixed = fixed if self.log_fixed is None else self.log_fixed + fixed
        self.pit.append(observations[..., FIXED:])
        self.tv.append(tv)


class PowerSimulation:
    """The power of :class:`BettingState` on the laws a run met, by Monte Carlo.

    At every observed position (null ``p``, aiming laws ``q`` and ``aimed``), each of ``replicates``
    (:data:`REPLICATES` in a run) simulated runs per departure ``(direction, size)`` emits a token from :func:`departure` (a law at that
    per-position TV from ``p``, or the farthest its direction reaches there) and bets as the real run does.
    ``power`` is the share of replicates whose e-value reached ``1/alpha``, looked at after each call (a
    lower bound on the power of the real run, which looks after every token), within the run's tokens.
    """

    def __init__(self, alpha: float, replicates: int = REPLICATES):
        self.threshold = math.log(1.0 / alpha)
        self.shape = (len(DIRECTIONS), len(SIZES), replicates)
        self.process = EProcess(self.shape)
        self.detected_at = np.full(self.shape, -1)
        self.tokens = 0
        self.tv_sum = np.zeros(self.shape[:2])
        self.short = np.zeros(self.shape[:2], dtype=np.int64)  # positions where the direction fell short of the size
        self.looks: list[tuple[int, np.ndarray]] = []  # (tokens, every replicate's family log e-values) per call

    def add(self, call: PowerCall) -> None:
        """Add one call's :class:`PowerCall`; look once, after it."""
        if not call.pit:
            return
        self.process.add(call.log_fixed, np.stack(call.pit, axis=-2))
        self.tokens += len(call.pit)
        tv = np.array(call.tv)
        self.tv_sum += tv.sum(axis=0)
        self.short += (tv < np.asarray(SIZES) - 1e-9).sum(axis=0)
        families = self.process.family_log_evalues()
        self.looks.append((self.tokens, families))
        log_e = logsumexp(families, axis=-1) - math.log(len(FAMILIES))
        fresh = (log_e >= self.threshold) & (self.detected_at < 0)
        self.detected_at[fresh] = self.tokens

    def power(self) -> np.ndarray:
        """``(directions, sizes)``: the share of replicates that rejected."""
        return (self.detected_at > 0).mean(axis=-1)

    def detectable_tv(self, directions: tuple[str, ...] = DIRECTIONS) -> float | None:
        """The smallest size at which every one of ``directions`` has power ``>=`` :data:`TARGET_POWER`."""
        rows = [DIRECTIONS.index(d) for d in directions]
        sure = (self.power()[rows] >= TARGET_POWER).all(axis=0)
        return next((s for s, ok in zip(SIZES, sure) if ok), None)

    def tokens_needed(self, size: float, directions: tuple[str, ...] = DIRECTIONS) -> int | None:
        """About how many tokens power :data:`TARGET_POWER` at ``size`` would take in the weakest of
        ``directions``. Each replicate's family e-values are carried forward from now at the drift per token
        their direction's replicates showed since the look nearest half the tokens, mixed as the e-value mixes
        them, with the spread per token of the mixture's increments over that window (a normal approximation; a
        replicate that already rejected stays detected). ``None`` before two looks or when nothing grows."""
        earlier = [look for look in self.looks if look[0] < self.tokens]
        if not earlier:
            return None
        then_tokens, then = min(earlier, key=lambda look: abs(look[0] - self.tokens / 2))
        column = SIZES.index(size)
        now = self.process.family_log_evalues()[:, column]  # (directions, replicates, families)
        then = then[:, column]
        window = self.tokens - then_tokens
        needed = self.tokens
        for d in directions:
            i = DIRECTIONS.index(d)
            drift = (now[i] - then[i]).mean(axis=0) / window  # per family
            mixed_now, mixed_then = (logsumexp(x, axis=-1) - math.log(len(FAMILIES)) for x in (now[i], then[i]))
            spread = float((mixed_now - mixed_then).std()) / math.sqrt(window)
            done = self.detected_at[i, column] > 0

            def power(more: int, now=now[i], drift=drift, spread=spread, done=done) -> float:
                ahead = logsumexp(now + drift * more, axis=-1) - math.log(len(FAMILIES))
                reach = (ahead - self.threshold) / max(spread * math.sqrt(more), 1e-12)
                return float(np.where(done, 1.0, norm.cdf(reach)).mean())

            if power(0) >= TARGET_POWER:
                continue
            if drift.max() <= 0:
                return None
            high = 1
            while power(high) < TARGET_POWER:
                high *= 2
            low = high // 2
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if power(middle) < TARGET_POWER else (low, middle)
            needed = max(needed, self.tokens + high)
        return needed

    def summary(self) -> dict:
        """The power table: per direction and size, the power, the mean per-position TV simulated, the share
        of positions where the direction fell short of the size, and the median tokens to detection."""
        power = self.power()
        rows = []
        for i, direction in enumerate(DIRECTIONS):
            for j, size in enumerate(SIZES):
                hit = self.detected_at[i, j] > 0
                rows.append({"direction": direction, "tv": size, "power": float(power[i, j]),
                             "mean_tv_simulated": float(self.tv_sum[i, j] / self.tokens) if self.tokens else 0.0,
                             "share_of_positions_short": float(self.short[i, j] / self.tokens) if self.tokens else 0.0,
                             "median_tokens_to_detection": float(np.median(self.detected_at[i, j][hit]))
                             if hit.any() else None})
        return {"replicates": self.shape[-1], "tokens": self.tokens, "rows": rows}


__all__ = ["DIRECTIONS", "REPLICATES", "SIZES", "TARGET_POWER", "PowerCall", "PowerSimulation", "departures"]
