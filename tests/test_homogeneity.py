"""The two-sample test between the batch-1 and the batched arm: its level, its power, and a
generator whose bug only the batch-1 arm sees."""

import numpy as np
from scipy import stats as sps

from lossless_check.adapters import resolve_generator
from lossless_check.api import run_cases
from lossless_check.homogeneity import two_sample_test
from lossless_check.results import Case
from lossless_check.scenarios import IID
from lossless_check.stats import Stratum

P = np.array([0.35, 0.25, 0.15, 0.1, 0.08, 0.04, 0.02, 0.01])


def arms(rng, law_a, law_b, n_a, n_b):
    return [Stratum(rng.multinomial(n_a, law_a), P)], [Stratum(rng.multinomial(n_b, law_b), P)]


def test_level_holds_under_the_null():
    """Both arms from P at alpha 0.05, 2000 runs: the rejection rate's one-sided binomial test against
    0.05 must not reject at 1e-4 (the chance this test fails a correct implementation)."""
    rng = np.random.default_rng(0)
    alpha, runs = 0.05, 2000
    rejections = sum(two_sample_test(*arms(rng, P, P, 200, 4800), alpha).pvalue <= alpha for _ in range(runs))
    assert sps.binomtest(rejections, runs, alpha, alternative="greater").pvalue > 1e-4


def test_detects_a_difference_above_its_threshold():
    """Arms differing by TV 0.4 (above the 0.30 threshold at n = 200 vs 4800, alpha 1e-7): rejected in
    at least 99 of 100 runs (a correct test misses with probability far below 1e-4 there)."""
    rng = np.random.default_rng(1)
    other = np.roll(P, 3)
    tv = 0.5 * np.abs(other - P).sum()
    first = two_sample_test(*arms(rng, other, P, 200, 4800), 1e-7)
    assert tv > first.threshold_tv
    hits = sum(two_sample_test(*arms(rng, other, P, 200, 4800), 1e-7).pvalue <= 1e-7 for _ in range(100))
    assert hits >= 99


def test_a_bug_only_the_batch_1_arm_sees_fails_batch_consistency():
    """Greedy drafts with a softmax q at batch 1 only: the batched rows are honest, the real loop is
    not. The case is batched (its q is consistent), and the arms disagree."""
    mutant = resolve_generator("fixtures.mutants.dflash_greedy_at_batch_1:DFlashGreedyAtBatch1")
    result = run_cases([Case(mutant, {"temperature": 1.5}, scenario=IID)], 5000, 1e-6, 0, sequential=False).cases[0]
    assert result.batch["batch_size"] > 1 and "consistent" in result.batch["note"]
    assert result.verdict == "not_lossless" and "batch_consistency" in result.failed_checks, result.reason
    assert "batched rows and batch-1 rows follow different laws" in result.reason


def test_the_same_generator_honest_at_every_batch_size_passes():
    """Control: the real DFlash under the same stack is batched and its arms agree."""
    result = run_cases([Case(resolve_generator("DFlashTokenCandidateGenerator"), {"temperature": 1.5}, scenario=IID)],
                       5000, 1e-6, 0, sequential=False).cases[0]
    assert result.verdict == "lossless" and result.batch["two_sample_p_value"] > 1e-3, result.reason
