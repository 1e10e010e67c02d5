"""Calibration of the verdict, measured: its false-failure rate under the null and its power at the
TV it claims, with checks that fail when either is off.

The data are simulated at the statistics level from exact laws (numpy, seeded): a correct generator
emits exactly such data (the engine's job is to make that true, and its own tests check it), so
this measures the statistics alone, fast enough to run thousands of times.

Every check here is itself a statistical test with an error rate of its own, stated in its docstring:
the chance that it fails although the implementation is correct. Each uses a one-sided exact
binomial test (equivalently, a one-sided Clopper-Pearson bound) at level ``1e-4`` or below, so the
whole file fails a correct implementation with probability below ``1e-3``. The seeds are fixed, so a
run is reproducible; the error rates are over the choice of seed. The checks that enumerate every
outcome of a small sample have no error at all.

The helpers take the test under calibration as an argument, and two tests plug in a deliberately
miscalibrated one (alpha silently multiplied by 20; a claimed ``tv_detectable`` halved) and show
that the checks fail it: a calibration test that cannot fail would measure nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps
from scipy.special import gammaln

from lossless_check.stats import Stratum, law_test, lr_test, verdict_test

#: The chance that one calibration check fails a correct implementation.
CHECK_ERROR_RATE = 1e-4

TestFn = Callable[[Sequence[Stratum], float], object]  # (strata, alpha) -> result with .rejects / .tv_detectable


# --------------------------------------------------------------------------------------------------
# Null laws and alternatives

P8 = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
SMALL3 = np.array([0.6, 0.3, 0.1])


def _iid8_target() -> np.ndarray:
    """The iid8 scenario's target law (no warpers): it has a rare token (p = 0.0036)."""
    from lossless_check.laws.scenarios import IID

    x = IID.target.rows[0]
    e = np.exp(x - x.max())
    return e / e.sum()


def _markov_like(seed: int = 11, strata: int = 40) -> list[tuple[np.ndarray, int]]:
    """Many small strata, as at position 2+ of a Markov scenario: random laws, sizes 1..25 (fixed)."""
    rng = np.random.default_rng(seed)
    laws = rng.dirichlet(np.full(8, 0.7), size=strata)
    return [(law, int(n)) for law, n in zip(laws, rng.integers(1, 26, strata))]


NULL_CASES: dict[str, Callable[[], list[tuple[np.ndarray, int]]]] = {
    "small3 n=60": lambda: [(SMALL3, 60)],
    "iid8 target n=500": lambda: [(_iid8_target(), 500)],
    "3 strata": lambda: [(P8, 300), (P8[::-1].copy(), 120), (np.full(8, 1 / 8), 40)],
    "40 small strata": _markov_like,
}


def move_mass(p: np.ndarray, tv: float, direction: str) -> np.ndarray:
    """A law at exactly ``tv`` from ``p``: mass moved from the likeliest token to the rarest
    (``rare``) or to the second likeliest (``top_two``), or ``p`` mixed toward uniform (``uniform``)."""
    q = p.copy()
    order = np.argsort(p)
    if direction == "uniform":
        u = np.full(len(p), 1 / len(p))
        return p + tv * (u - p) / (0.5 * np.abs(u - p).sum())
    target = order[0] if direction == "rare" else order[-2]
    if tv > q[order[-1]]:
        raise ValueError("tv larger than the likeliest token's mass")
    q[order[-1]] -= tv
    q[target] += tv
    return q


# --------------------------------------------------------------------------------------------------
# The calibration checks (helpers taking the test under calibration)


@dataclass
class CalibrationReport:
    """Outcome of a calibration check: ``ok`` is False when some row fails its one-sided binomial test."""

    kind: str
    rows: list[dict]
    error_rate: float

    @property
    def ok(self) -> bool:
        return not any(row["fails"] for row in self.rows)

    def failing(self) -> list[dict]:
        return [row for row in self.rows if row["fails"]]

    def __str__(self) -> str:
        lines = [f"{self.kind} calibration (check error rate {self.error_rate:g}):"]
        for row in self.rows:
            lines.append("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        return "\n".join(lines)


def _one_sided(events: int, runs: int, allowed: float, level: float) -> tuple[float, float, float]:
    """(p-value of "rate <= allowed" given ``events`` of ``runs``, and the one-sided Clopper-Pearson lower
    and upper bounds on the rate at confidence ``1 - level``). The p-value is ``<= level`` exactly when
    the lower bound is above ``allowed``: the row fails when the data prove the rate too high."""
    pvalue = float(sps.binomtest(events, runs, allowed, alternative="greater").pvalue)
    lower = 0.0 if events == 0 else float(sps.beta.ppf(level, events, runs - events + 1))
    upper = 1.0 if events == runs else float(sps.beta.ppf(1 - level, events + 1, runs - events))
    return pvalue, lower, upper


def null_calibration(test: TestFn, cases: dict[str, list[tuple[np.ndarray, int]]], alphas: Sequence[float],
                     runs: int, seed: int, error_rate: float = CHECK_ERROR_RATE) -> CalibrationReport:
    """False-failure rate of ``test`` on null data, per case and per nominal alpha.

    Each run draws every stratum's counts from its exact law (``multinomial(n, law)``) and asks
    ``test(strata, alpha).rejects(alpha)`` at every alpha. A row fails when the one-sided exact
    binomial test rejects "false-failure rate <= alpha" at level ``error_rate / rows`` (Bonferroni
    over the rows), i.e. when the one-sided Clopper-Pearson lower bound on the rate at confidence
    ``1 - error_rate / rows`` lies above alpha. If ``test`` is valid, the whole check fails with
    probability at most ``error_rate``.
    """
    level = error_rate / (len(cases) * len(alphas))
    rows = []
    for c, (name, laws) in enumerate(cases.items()):
        rng = np.random.default_rng([seed, c])
        rejections = dict.fromkeys(alphas, 0)
        for _ in range(runs):
            strata = [Stratum(rng.multinomial(n, law), law) for law, n in laws]
            for a in alphas:
                rejections[a] += bool(test(strata, a).rejects(a))
        for a in alphas:
            pvalue, lower, upper = _one_sided(rejections[a], runs, a, level)
            rows.append({"case": name, "alpha": a, "runs": runs, "false_fails": rejections[a],
                         "rate": rejections[a] / runs, "lower_bound": lower, "upper_bound": upper,
                         "pvalue": pvalue, "fails": pvalue <= level})
    return CalibrationReport("null", rows, error_rate)


def power_calibration(test: TestFn, cases: dict[str, tuple[list[tuple[np.ndarray, int]], str]], alpha: float,
                      runs: int, seed: int, power: float = 0.99,
                      error_rate: float = CHECK_ERROR_RATE) -> CalibrationReport:
    """Power of ``test`` at the TV it claims to detect with probability ``power``.

    For each case (null laws and sizes, and a direction of departure), ask ``test`` for its
    ``tv_detectable``, move every stratum's law by exactly that TV in that direction (so the
    sample-weighted TV is the claimed one), and count the runs the test does not reject. A row fails
    when the one-sided exact binomial test rejects "miss rate <= 1 - power" at level
    ``error_rate / cases``; a test whose claim holds fails the whole check with probability at most
    ``error_rate``.
    """
    level = error_rate / len(cases)
    rows = []
    for c, (name, (laws, direction)) in enumerate(cases.items()):
        rng = np.random.default_rng([seed, c])
        exemplar = [Stratum(np.round(law * n).astype(int), law) for law, n in laws]
        claimed = float(test(exemplar, alpha).tv_detectable)
        true_laws = [move_mass(law, claimed, direction) for law, _ in laws]
        misses = 0
        for _ in range(runs):
            strata = [Stratum(rng.multinomial(n, r), law) for (law, n), r in zip(laws, true_laws)]
            misses += not test(strata, alpha).rejects(alpha)
        pvalue, lower, upper = _one_sided(misses, runs, 1 - power, level)
        rows.append({"case": name, "direction": direction, "tv": claimed, "runs": runs, "misses": misses,
                     "miss_rate": misses / runs, "lower_bound": lower, "upper_bound": upper, "pvalue": pvalue,
                     "fails": pvalue <= level})
    return CalibrationReport("power", rows, error_rate)


def compositions(n: int, k: int) -> np.ndarray:
    rows = []
    for bars in itertools.combinations(range(n + k - 1), k - 1):
        edges = (-1,) + bars + (n + k - 1,)
        rows.append([edges[i + 1] - edges[i] - 1 for i in range(k)])
    return np.array(rows)


def exact_false_fail_rates(test: TestFn, law: np.ndarray, n: int, alphas: Sequence[float]) -> dict[float, float]:
    """The exact false-failure rate of ``test`` at each alpha, one stratum of ``n`` samples from ``law``:
    every count vector is enumerated and weighted by its multinomial probability (no simulation error)."""
    counts = compositions(n, len(law))
    log_pmf = gammaln(n + 1) - gammaln(counts + 1).sum(axis=1) + (counts * np.log(law)).sum(axis=1)
    pmf = np.exp(log_pmf)
    return {a: float(sum(w for c, w in zip(counts, pmf) if test([Stratum(c, law)], a).rejects(a))) for a in alphas}


def alpha_times_20(strata, alpha):
    """A miscalibrated verdict: alpha silently multiplied by 20 (its p-value divided by 20, so that
    ``rejects(alpha)`` is the correct verdict's ``rejects(20 * alpha)``)."""
    result = verdict_test(strata, 20 * alpha)
    return dataclasses.replace(result, pvalue=min(1.0, result.pvalue / 20))


def overclaims_power(strata, alpha):
    """A verdict that claims to detect half the TV it really can."""
    result = verdict_test(strata, alpha)
    return dataclasses.replace(result, tv_detectable=result.tv_detectable / 2)


def detectable_rate(runs: int, allowed: float, level: float, power: float = 0.99) -> float:
    """The true event rate a check of ``runs`` runs (one-sided binomial test of "rate <= allowed" at
    ``level``) detects with probability ``power``: the check's own power."""
    critical = sps.binom.isf(level, runs, allowed)
    return float(optimize.brentq(lambda r: sps.binom.sf(critical, runs, r) - power, allowed, 1.0))


def _cases(names=None) -> dict[str, list[tuple[np.ndarray, int]]]:
    return {k: f() for k, f in NULL_CASES.items() if names is None or k in names}


POWER_CASES = {
    "iid8 rare": ([(P8, 2000)], "rare"),
    "iid8 uniform": ([(P8, 2000)], "uniform"),
    "iid8 top_two": ([(P8, 2000)], "top_two"),
    "3 strata top_two": ([(P8, 1500), (P8[::-1].copy(), 600), (np.roll(P8, 3), 400)], "top_two"),
}


# --------------------------------------------------------------------------------------------------
# Fast checks (run by default)


def test_verdict_false_failure_rate_is_within_alpha():
    """300 null runs per case (one small stratum, the iid8 law with its rare token, three strata, 40 small
    strata) at alpha 0.01 and 0.05. Fails a correct verdict with probability <= 1e-4 (see
    :func:`null_calibration`); fails, with probability >= 0.99, one whose true rate were 0.079 at
    alpha 0.01 or 0.159 at alpha 0.05."""
    report = null_calibration(verdict_test, _cases(), (0.01, 0.05), runs=300, seed=2024)
    assert report.ok, report
    assert detectable_rate(300, 0.01, CHECK_ERROR_RATE / 8) < 0.079  # the check's own power, as stated
    assert detectable_rate(300, 0.05, CHECK_ERROR_RATE / 8) < 0.159


def test_verdict_power_is_at_least_what_it_claims():
    """At the claimed ``tv_detectable`` (alpha 1e-6), in three directions on one stratum and on three strata,
    the verdict misses at most 1% of 300 runs (up to the binomial test). Fails a correct claim with
    probability <= 1e-4; fails, with probability >= 0.99, a claim whose real miss rate were 0.075."""
    report = power_calibration(verdict_test, POWER_CASES, 1e-6, runs=300, seed=7)
    assert report.ok, report
    assert detectable_rate(300, 0.01, CHECK_ERROR_RATE / 4) < 0.075


def test_null_check_fails_a_test_whose_alpha_is_silently_20x():
    """The same null check, with the miscalibrated verdict plugged in, fails, and it fails on the
    non-degenerate row too (nominal 0.01 run at 0.2, whose true rate on this law, n = 60, is 0.066; see
    :func:`test_exact_rates_are_within_alpha_and_catch_alpha_x20`), not only where 20 alpha is 1.
    With 600 runs this detection misses with probability below 1e-4 over seeds."""
    cases = _cases(["small3 n=60"])
    assert null_calibration(verdict_test, cases, (0.01, 0.05), runs=600, seed=5).ok
    report = null_calibration(alpha_times_20, cases, (0.01, 0.05), runs=600, seed=5)
    assert not report.ok
    assert {row["alpha"] for row in report.failing()} == {0.01, 0.05}, report
    assert detectable_rate(600, 0.01, CHECK_ERROR_RATE / 2, power=1 - 1e-4) < 0.066


def test_power_check_fails_a_test_that_overclaims_its_power():
    """A verdict that reports half its real ``tv_detectable`` fails the power check (in the direction the
    L1 bound covers worst, the two likeliest tokens)."""
    cases = {"iid8 top_two": POWER_CASES["iid8 top_two"]}
    assert power_calibration(verdict_test, cases, 1e-6, runs=300, seed=9).ok
    report = power_calibration(overclaims_power, cases, 1e-6, runs=300, seed=9)
    assert not report.ok and report.rows[0]["miss_rate"] > 0.1, report


def test_exact_rates_are_within_alpha_and_catch_alpha_x20():
    """Every count vector of 40 samples over 3 tokens, weighted by its probability: the verdict's exact
    false-failure rate is at most alpha at every alpha of the grid (0.0002, 0.0025, 0.020 at 0.001,
    0.01, 0.05); the alpha-x20 verdict's is above it (0.0073, 0.048, 1). No simulation: this check
    has no error rate."""
    alphas = (1e-3, 0.01, 0.05)
    rates = exact_false_fail_rates(verdict_test, SMALL3, 40, alphas)
    assert all(rates[a] <= a for a in alphas), rates
    rates = exact_false_fail_rates(alpha_times_20, SMALL3, 40, alphas)
    assert rates[1e-3] > 5e-3 and rates[0.01] > 0.04 and rates[0.05] == pytest.approx(1.0), rates


# --------------------------------------------------------------------------------------------------
# Slow checks: more runs, more alphas


# heavy (.ci/run's first step; issue 41: 68 s in the suite).
@pytest.mark.slow
@pytest.mark.heavy
def test_verdict_false_failure_rate_is_within_alpha_slow():
    """2000 null runs per case at alpha 0.01, 0.05 and 0.2. Error rate of the check: <= 1e-4. Fails, with
    probability >= 0.99, a verdict whose true rate were 0.087 at alpha 0.05."""
    report = null_calibration(verdict_test, _cases(), (0.01, 0.05, 0.2), runs=2000, seed=31)
    assert report.ok, report
    assert detectable_rate(2000, 0.05, CHECK_ERROR_RATE / 12) < 0.087


@pytest.mark.slow
def test_verdict_power_is_at_least_what_it_claims_slow():
    """2000 runs per case at alpha 1e-6 and 1e-3. Error rate of the check: <= 1e-4 per alpha. Fails, with
    probability >= 0.99, a claim whose real miss rate were 0.029."""
    for alpha in (1e-6, 1e-3):
        report = power_calibration(verdict_test, POWER_CASES, alpha, runs=2000, seed=13)
        assert report.ok, report
    assert detectable_rate(2000, 0.01, CHECK_ERROR_RATE / 4) < 0.029


@pytest.mark.slow
def test_exact_rates_of_each_component_slow():
    """Every count vector of 60 samples over 3 tokens: the exact false-failure rate of the verdict and
    of each component (L1, likelihood ratio) is at most alpha. No error rate."""
    alphas = (1e-4, 1e-3, 0.01, 0.05, 0.2)
    for test in (verdict_test, law_test, lr_test):
        rates = exact_false_fail_rates(test, SMALL3, 60, alphas)
        assert all(rates[a] <= a for a in alphas), (test.__name__, rates)


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (23 s on 2 cores).
@pytest.mark.slow
@pytest.mark.heavy
def test_exact_rates_four_tokens_slow():
    """Every count vector of 30 samples over 4 tokens (one rare): exact rates <= alpha. No error rate."""
    law = np.array([0.5, 0.3, 0.15, 0.05])
    alphas = (1e-3, 0.01, 0.05, 0.2)
    for test in (verdict_test, law_test, lr_test):
        rates = exact_false_fail_rates(test, law, 30, alphas)
        assert all(rates[a] <= a for a in alphas), (test.__name__, rates)
