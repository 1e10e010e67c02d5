"""The verdict: the L1 test and the likelihood-ratio test together, alpha split between them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lossless_check.stats.evalues import lr_detectable_tv, lr_test
from lossless_check.stats.l1 import LawTestResult, detectable_tv, law_test, samples_for_tv
from lossless_check.stats.strata import Stratum

#: Default share of ``alpha`` the verdict gives the L1 test (the rest goes to the likelihood ratio).
SHARE_L1 = 0.5

# ---------------------------------------------------------------------------------------------
# The verdict: L1 and likelihood ratio together


@dataclass(frozen=True, kw_only=True)
class VerdictTestResult(LawTestResult):
    """Result of :func:`verdict_test`: the fields of :class:`LawTestResult` (same names and meaning:
    ``pvalue`` combined, finite-sample valid, ``min(1, p_l1 / share_l1, p_lr / (1 - share_l1))``;
    ``tv_detectable`` the combined guarantee, ``min(tv_detectable_l1, tv_detectable_lr)``; the L1
    component's ``bound`` and ``threshold_tv``) plus the two components and which rejected."""

    l1_pvalue: float
    lr_pvalue: float
    lr_log_evalue: float
    tv_detectable_l1: float
    tv_detectable_lr: float
    rejected_by: tuple[str, ...]  # at the alpha of the call: "support", "l1", "lr"
    alpha: float
    share_l1: float


def _check_share(share_l1: float) -> None:
    if not 0 < share_l1 < 1:
        raise ValueError("share_l1 must lie in (0, 1)")


def verdict_test(strata: Sequence[Stratum], alpha: float, power: float = 0.99,
                 share_l1: float = SHARE_L1) -> VerdictTestResult:
    """The verdict on one position: the L1 test and the likelihood-ratio test, ``alpha`` split between them.

    Assumptions (as :func:`law_test`): within a stratum the samples are i.i.d. from its ``expected`` law;
    strata are independent given their sizes (sizes may depend on earlier, independent data).

    - False-failure rate: ``P(pvalue <= a) <= a`` for every ``a`` and every sample size; in particular
      ``P(rejects(alpha)) <= alpha`` (union bound over the L1 test at ``share_l1 * alpha`` and the
      likelihood-ratio test at ``(1 - share_l1) * alpha``). A sample outside its law's support is an exact
      failure (``support_violations``), impossible under the null.
    - Power: against true laws at sample-weighted TV ``>= tv_detectable`` it rejects with probability
      ``>= power`` (the better of :func:`detectable_tv` at ``share_l1 * alpha`` and
      :func:`lr_detectable_tv` at the rest: the verdict rejects whenever either component does).
      Against mass moved into rare tokens, or mixed toward uniform, the likelihood ratio rejects with
      a fraction of the samples the L1 test needs (``benchmarks/power_table.py``).
    """
    _check_share(share_l1)
    strata = [s for s in strata if s.n > 0]
    a_l1, a_lr = share_l1 * alpha, (1.0 - share_l1) * alpha
    l1 = law_test(strata, a_l1, power)
    lr = lr_test(strata, a_lr, power)
    pvalue = float(min(1.0, l1.pvalue / share_l1, lr.pvalue / (1.0 - share_l1)))
    rejected = []
    if l1.support_violations:
        rejected.append("support")
    if l1.pvalue <= a_l1:
        rejected.append("l1")
    if lr.pvalue <= a_lr:
        rejected.append("lr")
    return VerdictTestResult(
        statistic=l1.statistic, pvalue=pvalue, n=l1.n, bound=l1.bound, threshold_tv=l1.threshold_tv,
        tv_detectable=min(l1.tv_detectable, lr.tv_detectable), support_violations=l1.support_violations,
        l1_pvalue=l1.pvalue, lr_pvalue=lr.pvalue, lr_log_evalue=lr.statistic,
        tv_detectable_l1=l1.tv_detectable, tv_detectable_lr=lr.tv_detectable,
        rejected_by=tuple(rejected), alpha=alpha, share_l1=share_l1,
        chi2=l1.chi2, chi2_dof=l1.chi2_dof, chi2_pvalue=l1.chi2_pvalue, g=l1.g, g_pvalue=l1.g_pvalue,
    )


def verdict_detectable_tv(strata_sizes: Sequence[int], vocab_size: int, expected: Sequence[np.ndarray] | None,
                          alpha: float, power: float = 0.99, share_l1: float = SHARE_L1) -> float:
    """:func:`verdict_test`'s ``tv_detectable`` before the data (``expected=None``: worst case over null laws)."""
    _check_share(share_l1)
    return min(detectable_tv(strata_sizes, vocab_size, expected, share_l1 * alpha, power),
               lr_detectable_tv(strata_sizes, vocab_size, expected, (1.0 - share_l1) * alpha, power))


def verdict_samples_for_tv(tv: float, vocab_size: int, alpha: float, power: float = 0.99,
                           share_l1: float = SHARE_L1) -> int:
    """Samples one stratum needs so that :func:`verdict_test` detects ``tv`` with probability ``>= power``
    (worst case over null laws of size ``vocab_size``): the smallest ``n`` with
    ``verdict_detectable_tv([n], ...) <= tv``."""
    if not 0 < tv <= 1:
        raise ValueError("tv must be in (0, 1]")
    hi = samples_for_tv(tv, vocab_size, share_l1 * alpha, power)
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if verdict_detectable_tv([mid], vocab_size, None, alpha, power, share_l1) <= tv:
            hi = mid
        else:
            lo = mid
    return hi

