"""Tests of an empirical token law against an exact one, with finite-sample error guarantees.

The central object is a *stratified* sample: groups (strata) of tokens, each group drawn i.i.d.
from its own exactly known distribution ``p_s`` under the null hypothesis. One position of a
speculative-decoding round is one such sample: the strata are the distinct target distributions
``p_j(. | prefix)`` met by the trials that reached position ``j``. Every guarantee below holds
*conditionally on the stratum sizes* ``n_s`` (they may depend on earlier, independent data: the
tokens before the tested one), for every sample size: nothing here is asymptotic.

Two tests, and the verdict that combines them (:func:`verdict_test`):

**L1 / total-variation test** (:func:`law_test`). Statistic ``S = sum_s || c_s - n_s p_s ||_1``
(``c_s`` the counts of stratum ``s``), i.e. twice the sample-weighted TV distance times
``N = sum_s n_s``. Its p-value is the smallest of several valid bounds on the null tail
``P(S >= t)``, each a function of ``t``, ``p`` and ``n`` only (the minimum of valid tail bounds is a
valid tail bound, so ``P(pvalue <= a) <= a`` for every ``a``):

- ``types`` (Weissman et al. 2003, extended to a product of multinomials):
  ``P(S >= t) <= 2^K exp(-t^2 / (2N))`` with ``K = sum_s |supp p_s|``;
- ``mcdiarmid``: one sample moves ``S`` by at most 2, so ``P(S >= E S + t) <= exp(-t^2 / (2N))``, with
  ``E S = sum_{s,i} E|Bin(n_s, p_si) - n_s p_si|`` computed exactly (de Moivre's closed form,
  :func:`binomial_mad`; the release before used the larger Jensen bound ``sqrt(n p (1 - p))``);
- ``subsets``: ``S / 2 = sum_s max_A (c_s(A) - n_s p_s(A))`` over token sets ``A``, so a union bound
  over one set per stratum with the exact binomial moment generating function (Chernoff), which
  factorises over strata: ``P(S >= t) <= inf_l e^{-l t / 2} prod_s sum_A E e^{l (c_s(A) - n_s p_s(A))}``;
  for a single stratum also the union of the exact binomial tails ``sum_A P(c(A) >= n p(A) + t/2)``.
  It replaces ``types`` where both apply (Hoeffding's bound on each set's moment generating function
  gives ``types`` back). A support of more than :data:`MAX_ENUMERATED_SUPPORT` tokens uses the
  Poisson (Bennett) bound on each set's generating function, which factorises over tokens.

**Likelihood-ratio test** (:func:`lr_test`). A fixed-sample e-value: per stratum the marginal
likelihood of the counts under a Dirichlet prior on the stratum's law, over the support of ``p_s``,
divided by their likelihood under ``p_s``; the product over strata; a finite mixture of such
products over a few priors fixed before the data. ``E_p[E] = 1`` for any prior (exchange the
prior integral and the expectation), so ``P(E >= 1/a) <= a`` by Markov's inequality, at every
``n``, and ``pvalue = min(1, 1/E)``. It is the chi-square-family test: its log grows like
``n KL(r || p)`` against a true law ``r``, which sees mass moved into rare tokens far sooner than
the L1 distance does.

**Verdict** (:func:`verdict_test`): ``alpha`` is split, ``share_l1 * alpha`` to the L1 test and the
rest to the likelihood-ratio test; the combined p-value ``min(1, p_l1 / share_l1,
p_lr / (1 - share_l1))`` is valid by the union bound. Its power guarantee ``tv_detectable`` is the
better of the two components' (the combined test rejects whenever either does).

**Many strata, large supports** (rules that depend on the laws and stratum sizes only, never on the
counts). The ``types`` bound pays ``2^K`` with ``K`` the support summed over strata, useless with many
strata. The L1 test computes ``subsets`` for at most :data:`MAX_SUBSET_STRATA` strata and enumerates
supports of at most :data:`MAX_ENUMERATED_SUPPORT` tokens (Bennett beyond); past that, ``mcdiarmid``
(exact mean, no ``2^K``) carries it. The likelihood ratio pools the strata through one prior scale
shared by all of them (a product over strata inside each mixture component), and a prior centred on
``p_s`` gives a one-sample stratum the e-value 1 exactly, so many small strata and large supports
cost it nothing: no coarsening is needed there (``benchmarks/power_table.py``, 40-strata rows).

Power of the L1 test comes from the same inequalities applied to the unknown true law ``r`` (with
the vocabulary size in place of the support), so a "detectable TV" is a guarantee, not a normal
approximation. Pearson chi-square and G statistics (scipy, asymptotic) are reported beside as
diagnostics only: their p-values are not valid at small alpha.

The layer's mathematics: imports only numpy and scipy (nothing else of lossless_check but core).
"""

from __future__ import annotations


from lossless_check.stats.diagnostics import MIN_EXPECTED_COUNT
from lossless_check.stats.evalues import (
    LR_SCALES, LRTestResult, dirichlet_log_evalue, kt_regret, lr_detectable_tv, lr_log_evalue, lr_log_evalue_batch,
    lr_test, mixture_log_evalues,
)
from lossless_check.stats.l1 import (
    L1_BOUNDS, L1_BOUNDS_LEGACY, MAX_ENUMERATED_SUPPORT, MAX_SUBSET_STRATA, LawTestResult, binomial_mad, detectable_tv,
    l1_threshold, law_test, samples_for_tv, tv_confidence_interval,
)
from lossless_check.stats.strata import AcceptanceLaw, Stratum, bonferroni_min, holm_correction
from lossless_check.stats.verdict import (
    SHARE_L1, VerdictTestResult, verdict_detectable_tv, verdict_samples_for_tv, verdict_test,
)

__all__ = ["AcceptanceLaw", "L1_BOUNDS", "L1_BOUNDS_LEGACY", "LR_SCALES", "LRTestResult", "LawTestResult",
           "MAX_ENUMERATED_SUPPORT", "MAX_SUBSET_STRATA", "MIN_EXPECTED_COUNT", "SHARE_L1", "Stratum",
           "VerdictTestResult", "binomial_mad", "bonferroni_min", "detectable_tv", "dirichlet_log_evalue",
           "holm_correction", "kt_regret", "l1_threshold", "law_test", "lr_detectable_tv", "lr_log_evalue",
           "lr_log_evalue_batch", "lr_test", "mixture_log_evalues", "samples_for_tv", "tv_confidence_interval",
           "verdict_detectable_tv", "verdict_samples_for_tv", "verdict_test"]
