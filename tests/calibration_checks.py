"""Test-only helpers for the calibration checks: a null round simulated with numpy, and the one-sided
binomial check every calibration test decides with (with its power against a stated rate).

The simulated round is what step mode observes from a lossless generator, without any harness: rows
of emitted tokens (``-1`` past the end), the token at position ``j`` drawn from an exact law that
depends on the two tokens before it, and a row reaching position ``j + 1`` with a probability that
depends on its token at ``j`` (acceptance). So the number of rows reaching a position, and every
stratum's size, is random and depends on earlier tokens, as in step mode.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import stats as sps


def rate_check(events: int, runs: int, allowed: float, level: float) -> dict:
    """One-sided exact binomial test of "event rate <= allowed": ``fails`` when it rejects at ``level``
    (so a rate within ``allowed`` fails with probability at most ``level``)."""
    pvalue = float(sps.binomtest(events, runs, allowed, alternative="greater").pvalue)
    return {"events": events, "runs": runs, "rate": events / runs, "allowed": allowed, "pvalue": pvalue,
            "fails": pvalue <= level}


def curtailed_rate_check(event: Callable[[int], bool], runs: int, allowed: float, level: float) -> dict:
    """:func:`rate_check` of ``event(seed)`` over seeds ``0 .. runs - 1``, stopping as soon as the
    remaining runs cannot change whether it fails (``fails`` only grows with the events: it is decided
    once the events so far fail, or once they pass even with every run not made counted as an event).
    The same verdict as the full count on the same seeds, so the same error rate and power; ``made``
    says how many runs it took, ``events`` is the count that decided (so far, or its upper bound)."""
    events = 0
    for made in range(1, runs + 1):
        events += bool(event(made - 1))
        failing, at_most = rate_check(events, runs, allowed, level), rate_check(events + runs - made, runs, allowed, level)
        if failing["fails"] or not at_most["fails"]:  # after the last run these are the same count
            return {**(failing if failing["fails"] else at_most), "made": made}
    raise ValueError("runs must be positive")


def check_power(runs: int, allowed: float, level: float, true_rate: float) -> float:
    """Probability that :func:`rate_check` fails when the true event rate is ``true_rate``: the
    binomial test rejects when the events exceed the critical count ``c`` with ``P(Bin(runs, allowed) > c) <= level``."""
    critical = sps.binom.isf(level, runs, allowed)
    while sps.binom.sf(critical, runs, allowed) > level:  # isf may round down
        critical += 1
    return float(sps.binom.sf(critical, runs, true_rate))


class NullRound:
    """Exact laws of a small speculative round, and rows drawn from them (a lossless generator).

    ``law_of(prefix)`` is the law of the next token after ``prefix``: one of ``(vocab + 1)^2`` fixed
    random laws chosen by the two tokens before it (``vocab`` stands for "no token"). A row reaches the
    next position with probability ``acceptance[token]``.
    """

    def __init__(self, vocab: int = 6, depth: int = 3, seed: int = 0, concentration: float = 0.8):
        rng = np.random.default_rng(seed)
        self.vocab, self.depth = vocab, depth
        self.laws = rng.dirichlet(np.full(vocab, concentration), size=(vocab + 1, vocab + 1))
        self.acceptance = np.linspace(0.9, 0.2, vocab)

    def law_of(self, prefix: tuple) -> np.ndarray:
        padded = (self.vocab, self.vocab) + tuple(prefix)
        return self.laws[padded[-2], padded[-1]]

    def draw(self, rng: np.random.Generator, trials: int) -> np.ndarray:
        """``(trials, depth)`` emitted rows, ``-1`` past where each row stopped."""
        rows = np.full((trials, self.depth), -1, dtype=np.int64)
        alive = np.ones(trials, dtype=bool)
        before = np.full((trials, 2), self.vocab)
        for j in range(self.depth):
            cdf = np.cumsum(self.laws[before[:, 0], before[:, 1]], axis=1)
            token = np.minimum((rng.random(trials)[:, None] > cdf).sum(axis=1), self.vocab - 1)
            rows[alive, j] = token[alive]
            before = np.column_stack([before[:, 1], token])
            alive &= rng.random(trials) < self.acceptance[token]
        return rows
