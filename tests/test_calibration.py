"""Calibration through the real verifier: the null false-failure rate, measured at a loose alpha."""

from scipy import stats as sps

from lossless_check.adapters import resolve_generator
from lossless_check.runner import Case, run
from lossless_check.scenarios import IID


def test_null_false_failure_rate_through_the_real_verifier():
    """A correct generator over many seeds, alpha 0.2 per run: the rejection rate stays within 0.2.

    The bounds are conservative, so the observed rate is usually 0; the test fails only if the
    rate's 99.9% binomial lower confidence bound exceeds the nominal alpha.
    """
    alpha, runs = 0.2, 16
    case = Case(resolve_generator("DFlashTokenCandidateGenerator"), {"top_k": 3}, scenario=IID)
    rejections = sum(run([case], 300, alpha, seed).cases[0].verdict == "not_lossless" for seed in range(runs))
    assert sps.binomtest(rejections, runs).proportion_ci(0.999).low <= alpha
