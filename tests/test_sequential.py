"""Sequential runs: the anytime e-value stops a bug early, on the fixed run's own trials; a clean
case runs to the planned sample count; the false-failure rate holds through the real verifier."""

import math

import numpy as np
from scipy import stats as sps
from scipy.special import logsumexp

from lossless_check.adapters import resolve_generator
from lossless_check.api import run_cases as run
from lossless_check.engine import case_seed, chunk_sizes, look_schedule
from lossless_check.modes.replay import replays_per_chunk
from lossless_check.modes.step import Observations, StepCase
from lossless_check.results import Case
from lossless_check.scenarios import DEFAULT, IID

MUTANT = "fixtures.mutants.dflash_raw_logits:DFlashReturnsRawLogits"
ALPHA = 1e-6


def test_looks_fall_on_chunk_boundaries():
    boundaries = set(np.cumsum(chunk_sizes(5000)).tolist())
    assert set(look_schedule(5000, True)) <= boundaries
    assert look_schedule(5000, True)[0] < 200 and look_schedule(5000, False) == [5000]


def test_a_bug_stops_at_the_first_trial_where_the_evalue_crosses_on_the_fixed_runs_trials():
    case = Case(resolve_generator(MUTANT), {"temperature": 0.5}, scenario=IID)
    result = run([case], 5000, ALPHA, seed=0, sequential=True).cases[0]
    assert result.verdict == "not_lossless" and "e_value" in result.failed_checks
    assert result.p_value <= ALPHA and result.samples < 1000

    # The same trials a fixed run collects, and the e-process recomputed on them, independently.
    step = StepCase(case)
    replays = replays_per_chunk(5000)
    obs = Observations.concatenate([step.collect(size, case_seed(0, case, c), replays[c])
                                    for c, size in enumerate(chunk_sizes(1000))])
    combined = logsumexp(step.log_evalues(obs), axis=0) - math.log(step.positions + 1)
    assert result.samples == int(np.argmax(combined >= math.log(2 / ALPHA))) + 1
    assert "anytime e-value" in result.reason


def test_a_clean_case_runs_to_the_planned_count_and_keeps_the_power_guarantee():
    case = Case(resolve_generator("DFlashTokenCandidateGenerator"), {"top_k": 3}, scenario=DEFAULT)
    sequential = run([case], 2000, ALPHA, seed=0, sequential=True).cases[0]
    fixed = run([case], 2000, ALPHA, seed=0, sequential=False).cases[0]
    assert sequential.verdict == fixed.verdict == "lossless"
    assert sequential.samples == 2000 and sequential.tv == fixed.tv  # the same trials
    # Half the alpha goes to the fixed-sample test: a slightly larger detectable TV, stated.
    assert fixed.tv_detectable < sequential.tv_detectable < 1.1 * fixed.tv_detectable
    assert sequential.log_e_value is not None and sequential.alpha_case == ALPHA


def test_sequential_null_false_failure_rate_through_the_real_verifier():
    """Alpha 0.2 per run, looked at after every trial: the rejection rate stays within 0.2 (the
    test fails only if the rate's 99.9% lower confidence bound exceeds it)."""
    alpha, runs = 0.2, 12
    case = Case(resolve_generator("DFlashTokenCandidateGenerator"), {"temperature": 0.6}, scenario=IID)
    rejections = sum(run([case], 500, alpha, seed, sequential=True).cases[0].verdict == "not_lossless"
                     for seed in range(runs))
    assert sps.binomtest(rejections, runs).proportion_ci(0.999).low <= alpha


def test_sequential_evidence_flags_a_token_outside_the_support():
    """One stratification gives the e-values and the exact support check: a single emitted token of
    probability 0 is flagged (the e-values leave it out), and the same rows without it are not."""
    from lossless_check.analysis import log_evalues, sequential_evidence

    law = np.array([0.5, 0.5, 0.0])
    clean = np.array([[0, 1], [1, 0], [0, 0]] * 10)
    bad = clean.copy()
    bad[17, 1] = 2
    for rows, flagged in ((clean, False), (bad, True)):
        log_e, outside = sequential_evidence(rows, 2, lambda prefix: law)
        assert outside is flagged
        assert np.array_equal(log_e, log_evalues(rows, 2, lambda prefix: law))
