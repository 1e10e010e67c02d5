"""Power at the claimed ``tv_detectable`` of the L1, likelihood-ratio and verdict tests, with a check
strong enough to fail a claim 20% below the truth.

One stratum of n = 2000 samples from the iid8 law ``P8`` at alpha 1e-6 (the verdict's components at
half of it each, as the verdict splits it). Simulations are vectorised: the L1 test rejects when
``S = ||c - n p||_1`` reaches :func:`~lossless_check.stats.l1_threshold`, the likelihood-ratio test
when :func:`~lossless_check.stats.lr_log_evalue_batch` reaches ``log(1 / alpha)``;
:func:`test_the_vectorised_rules_are_the_library_tests` checks that these are the library's decisions.

The guarantees are worst cases over true laws at a given TV. Three directions are tried (mass moved
from the likeliest token to the second likeliest, ``top_two``; to the rarest, ``rare``; the law mixed
toward uniform, ``uniform``); for each test the least favourable one is the direction whose measured
99%-power TV (``true_tv``) is largest. "The truth" is that measured TV; the claim must be at least it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibration_checks import check_power, rate_check
from lossless_check.stats import (
    Stratum, detectable_tv, l1_threshold, law_test, lr_detectable_tv, lr_log_evalue_batch, lr_test,
    verdict_detectable_tv, verdict_test,
)
from test_calibration import P8, move_mass

N, ALPHA, POWER = 2000, 1e-6, 0.99
DIRECTIONS = ("top_two", "rare", "uniform")
TESTS = ("l1", "lr", "verdict")
CHECK_RUNS = 1000
LEVEL = 1e-4 / len(TESTS)  # the three claim checks together fail a correct implementation w.p. <= 1e-4


def rejects(test: str, counts: np.ndarray) -> np.ndarray:
    """The test's decision on each row of ``counts`` (one stratum of law P8), vectorised."""
    def l1(alpha):
        return np.abs(counts - N * P8).sum(axis=1) >= l1_threshold([N], [P8], alpha)

    def lr(alpha):
        return lr_log_evalue_batch(counts, P8) >= math.log(1.0 / alpha)

    if test == "verdict":
        return l1(ALPHA / 2) | lr(ALPHA / 2)
    return l1(ALPHA) if test == "l1" else lr(ALPHA)


CLAIMS = {"l1": detectable_tv([N], len(P8), [P8], ALPHA, POWER),
          "lr": lr_detectable_tv([N], len(P8), [P8], ALPHA, POWER),
          "verdict": verdict_detectable_tv([N], len(P8), [P8], ALPHA, POWER)}


def miss_rate(test: str, tv: float, direction: str, runs: int, seed: int) -> float:
    counts = np.random.default_rng(seed).multinomial(N, move_mass(P8, tv, direction), size=runs)
    return float(1.0 - rejects(test, counts).mean())


def true_tv(test: str, direction: str, runs: int = 4000, seed: int = 0) -> float:
    """The TV at which the test's measured power is 0.99 in ``direction`` (bisection, common draws)."""
    lo, hi = 0.0, min(0.29, CLAIMS[test] * 2)
    for _ in range(16):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if miss_rate(test, mid, direction, runs, seed) > 1 - POWER else (lo, mid)
    return hi


@pytest.fixture(scope="module")
def least_favourable() -> dict[str, tuple[str, float]]:
    """Per test, its least favourable direction and the measured 99%-power TV there."""
    out = {}
    for test in TESTS:
        tvs = {d: true_tv(test, d) for d in DIRECTIONS}
        worst = max(tvs, key=tvs.get)
        out[test] = (worst, tvs[worst])
    return out


def power_check(test: str, claimed_tv: float, direction: str, seed: int) -> dict:
    """1000 draws at exactly the claimed TV in ``direction``: fails when the one-sided binomial test
    rejects "miss rate <= 0.01" at :data:`LEVEL`."""
    misses = round(miss_rate(test, claimed_tv, direction, CHECK_RUNS, seed) * CHECK_RUNS)
    return rate_check(misses, CHECK_RUNS, 1 - POWER, LEVEL)


def test_the_vectorised_rules_are_the_library_tests():
    """The vectorised decisions are those of law_test, lr_test and verdict_test, on draws at TV 0.066
    (``top_two``), near the measured 99%-power TVs, where decisions are mixed."""
    library = {"l1": lambda s: law_test(s, ALPHA).rejects(ALPHA), "lr": lambda s: lr_test(s, ALPHA).rejects(ALPHA),
               "verdict": lambda s: verdict_test(s, ALPHA).rejects(ALPHA)}
    for test in TESTS:
        counts = np.random.default_rng(1).multinomial(N, move_mass(P8, 0.066, "top_two"), size=60)
        decided = [library[test]([Stratum(c, P8)]) for c in counts]
        assert 0 < sum(decided) < len(decided), test
        assert rejects(test, counts).tolist() == decided, test
    assert verdict_test([Stratum(counts[0], P8)], ALPHA).tv_detectable == pytest.approx(CLAIMS["verdict"])


def test_power_at_the_claim_and_a_claim_20_percent_below_the_truth_is_caught(least_favourable):
    """At each test's claimed ``tv_detectable``, in its least favourable direction, the miss rate passes
    the one-sided binomial check of "<= 0.01" (1000 draws; the three checks fail correct claims with
    probability <= 1e-4 together). A claim 20% below the measured truth (``true_tv / 1.2``) fails the
    same check; the check's power against it, computed from its miss rate on 4000 other draws, is
    >= 0.9999 (measured miss rates there: 0.18 L1, 0.20 likelihood ratio, 0.16 verdict). The claims
    exceed the measured truths by 1.35x (L1, ``uniform``), 2.19x (likelihood ratio, ``top_two``) and
    1.62x (verdict, ``uniform``): worst-case guarantees, conservative here."""
    for test in TESTS:
        direction, truth = least_favourable[test]
        claim = CLAIMS[test]
        assert not power_check(test, claim, direction, seed=2)["fails"], (test, direction, claim, truth)
        overclaim = truth / 1.2
        assert power_check(test, overclaim, direction, seed=3)["fails"], (test, direction, overclaim)
        assert check_power(CHECK_RUNS, 1 - POWER, LEVEL, miss_rate(test, overclaim, direction, 4000, 4)) >= 0.9999
