"""Two-sample test between a case's batch-1 arm and its batched arm.

``_assisted_decoding`` only ever calls a generator with one row, while the batched arm drafts many
rows in one call. Within each stratum (trials whose position-``j`` token has the same exact law),
the two arms' token counts should follow one law. The statistic is

    T = sum_s h_s || a_s / n_as - b_s / n_bs ||_1,      h_s = n_as n_bs / (n_as + n_bs),

and its null tail is bounded without asymptotics. Under the case's null (both arms draw each
stratum's tokens i.i.d. from its exact law ``p_s``, strata independent given their sizes):

- one trial moves ``T`` by at most ``2 h_s / n_as`` (arm a) or ``2 h_s / n_bs`` (arm b), and these
  squared add up to ``4 H`` with ``H = sum_s h_s``, so McDiarmid gives
  ``P(T >= E T + t) <= exp(-t^2 / (2 H))``;
- by Jensen, ``E T <= m = sum_s sqrt(h_s) sum_x sqrt(p_sx (1 - p_sx))``.

So ``p = exp(-(T - m)_+^2 / (2 H))`` is a valid p-value at every sample size. ``T / (2 H)`` is a
sample-weighted total-variation distance between the arms; the test detects a difference between
them of about ``(m + sqrt(2 H log(1/alpha))) / (2 H)`` and more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .stats import Stratum


@dataclass(frozen=True)
class TwoSampleResult:
    """Result of :func:`two_sample_test` (``statistic``: the weighted TV between the arms)."""

    statistic: float
    pvalue: float
    threshold_tv: float  # the arms differ significantly at the test's alpha beyond this weighted TV
    n_a: int
    n_b: int


def two_sample_test(arm_a: Sequence[Stratum], arm_b: Sequence[Stratum], alpha: float) -> TwoSampleResult:
    """Test that two arms' counts follow the same law in every stratum (``arm_a[s]`` and ``arm_b[s]``
    share stratum ``s`` and its exact law). Strata empty in either arm carry no information and are
    left out."""
    t_stat = h_total = m = 0.0
    n_a = n_b = 0
    for a, b in zip(arm_a, arm_b):
        if a.n == 0 or b.n == 0:
            continue
        h = a.n * b.n / (a.n + b.n)
        t_stat += h * float(np.abs(a.counts / a.n - b.counts / b.n).sum())
        m += math.sqrt(h) * float(np.sqrt(a.expected * (1 - a.expected)).sum())
        h_total += h
        n_a, n_b = n_a + a.n, n_b + b.n
    if h_total == 0:
        return TwoSampleResult(0.0, 1.0, 1.0, n_a, n_b)
    excess = max(t_stat - m, 0.0)
    pvalue = math.exp(-(excess**2) / (2 * h_total))
    threshold = (m + math.sqrt(2 * h_total * math.log(1 / alpha))) / (2 * h_total)
    return TwoSampleResult(t_stat / (2 * h_total), min(1.0, pvalue), min(1.0, threshold), n_a, n_b)
