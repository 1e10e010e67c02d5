"""Sequential runs: the anytime e-value stops a bug early, on the fixed run's own trials; a clean
case runs to the planned sample count; the false-failure rate holds through the real verifier."""

import math

import numpy as np
from scipy.special import logsumexp

from calibration_checks import check_power, curtailed_rate_check, rate_check

from lossless_check.subjects.adapters import resolve_generator
from lossless_check.faces.api import run_cases as run
from lossless_check.running.chunks import case_seed, chunk_sizes, look_schedule
from lossless_check.modes.replay import replays_per_chunk
from lossless_check.modes.step import Observations, StepCase
from lossless_check.evidence.results import Case
from lossless_check.laws.scenarios import DEFAULT, IID
from fixtures.releases import DFLASH, needs

MUTANT = "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits"
ALPHA = 1e-6


def test_looks_fall_on_chunk_boundaries():
    boundaries = set(np.cumsum(chunk_sizes(5000)).tolist())
    assert set(look_schedule(5000, True)) <= boundaries
    assert look_schedule(5000, True)[0] < 200 and look_schedule(5000, False) == [5000]


@needs(DFLASH)
def test_a_bug_stops_at_the_first_trial_where_the_evalue_crosses_on_the_fixed_runs_trials():
    case = Case(resolve_generator(MUTANT), {"temperature": 0.5}, scenario=IID)
    result = run([case], 5000, ALPHA, seed=0, sequential=True).cases[0]
    assert result.verdict == "not_lossless" and "e_value" in result.failed_checks
    assert result.p_value <= ALPHA and result.samples < 1000

    # Batched rows never fail a case: the batched stage's rejection moved it to batch 1 (issue 39).
    assert result.batch["batch_size"] == 1 and "batched rows failed" in result.batch["note"], result.batch
    # The same trials a fixed run at batch 1 collects, and the e-process recomputed on them, independently.
    step = StepCase(case, batch_size=1)
    replays = replays_per_chunk(5000)
    obs = Observations.concatenate([step.collect(size, case_seed(0, case, c), replays[c])
                                    for c, size in enumerate(chunk_sizes(1000))])
    combined = logsumexp(step.log_evalues(obs), axis=0) - math.log(step.positions + 1)
    assert result.samples == int(np.argmax(combined >= math.log(2 / ALPHA))) + 1
    assert "sequential e-value test rejects" in result.reason


@needs(DFLASH)
def test_a_clean_case_runs_to_the_planned_count_and_keeps_the_power_guarantee():
    case = Case(resolve_generator("DFlashTokenCandidateGenerator"), {"top_k": 3}, scenario=DEFAULT)
    sequential = run([case], 2000, ALPHA, seed=0, sequential=True).cases[0]
    fixed = run([case], 2000, ALPHA, seed=0, sequential=False).cases[0]
    assert sequential.verdict == fixed.verdict == "lossless"
    assert sequential.samples == 2000 and sequential.tv == fixed.tv  # the same trials
    # Half the alpha goes to the fixed-sample test: a slightly larger detectable TV, stated.
    assert fixed.tv_detectable < sequential.tv_detectable < 1.1 * fixed.tv_detectable
    assert sequential.log_e_value is not None and sequential.alpha_case == ALPHA


@needs(DFLASH)
def test_sequential_null_false_failure_rate_through_the_real_verifier():
    """Alpha 0.1 per run of 50 trials, looked at after every trial, 40 seeds: one-sided exact binomial
    test of "rejection rate <= 0.1", failing at level 1e-4 (13 or more rejections). A correct
    implementation fails it with probability <= 1e-4; one whose true rate were 5 alpha (0.5) fails it
    with probability 0.992 (``check_power``). The anytime e-value's own calibration, with many more
    runs and its broken variants, is :func:`test_anytime_evalue_null_rate_a_5x_test_and_broken_combinations_are_caught`."""
    alpha, runs, level = 0.1, 40, 1e-4
    case = Case(resolve_generator("DFlashTokenCandidateGenerator"), {"temperature": 0.6}, scenario=IID)
    # Curtailed: stops once 13 rejections are reached or can no longer be (same verdict as all 40 runs).
    row = curtailed_rate_check(lambda seed: run([case], 50, alpha, seed, sequential=True).cases[0].verdict
                               == "not_lossless", runs, alpha, level)
    assert not row["fails"], row
    assert check_power(runs, alpha, level, 5 * alpha) >= 0.99


def test_sequential_evidence_flags_a_token_outside_the_support():
    """One stratification gives the e-values and the exact support check: a single emitted token of
    probability 0 is flagged (the e-values leave it out), and the same rows without it are not."""
    from lossless_check.evidence.analysis import log_evalues, sequential_evidence

    law = np.array([0.5, 0.5, 0.0])
    clean = np.array([[0, 1], [1, 0], [0, 0]] * 10)
    bad = clean.copy()
    bad[17, 1] = 2
    for rows, flagged in ((clean, False), (bad, True)):
        log_e, outside = sequential_evidence(rows, 2, lambda prefix: law)
        assert outside is flagged
        assert np.array_equal(log_e, log_evalues(rows, 2, lambda prefix: law))


# --------------------------------------------------------------------------------------------------
# The anytime e-value at the statistics level: many null rounds, cheap (no harness runs)

#: Nominal case alphas of the anytime checks: the e-value gets half, so it may reject in at most
#: 0.05 and 0.2 of null runs.
ANYTIME_ALPHAS = (0.1, 0.4)
ANYTIME_RUNS = 2000
ANYTIME_LEVEL = 1e-4 / len(ANYTIME_ALPHAS)


def null_evalues() -> list[np.ndarray]:
    """The per-position e-processes and their product (:func:`~lossless_check.evidence.analysis.log_evalues`)
    of :data:`ANYTIME_RUNS` null rounds: 50 to 300 trials, four positions reached depending on
    acceptance (:class:`calibration_checks.NullRound`)."""
    from calibration_checks import NullRound
    from lossless_check.evidence.analysis import log_evalues

    null_round, rng = NullRound(depth=4, seed=1), np.random.default_rng(5)
    return [log_evalues(null_round.draw(rng, int(rng.integers(50, 301))), null_round.depth, null_round.law_of,
                        null_round.vocab) for _ in range(ANYTIME_RUNS)]


def anytime_null_check(evalues, monkeypatch, combine_for_run=None) -> list[dict]:
    """False-failure rate of the sequential stop rule on null rounds, per case alpha.

    Each round's e-processes go to :func:`~lossless_check.evidence.analysis.stop_sequentially` at its last look
    with a fixed-sample p-value of 1, so the case fails exactly when the averaged e-process
    (``combined_log_evalue``) crossed ``2 / alpha`` at some trial. A row fails when the one-sided
    binomial test rejects "rate <= alpha / 2" at :data:`ANYTIME_LEVEL`: probability <= 1e-4 for a
    correct implementation. ``combine_for_run(u)``, ``u`` uniform and independent per run, gives a
    replacement ``combined_log_evalue`` (broken variants).
    """
    from lossless_check.evidence import analysis
    from lossless_check.evidence.results import CaseResult

    rng = np.random.default_rng(6)
    failures = dict.fromkeys(ANYTIME_ALPHAS, 0)
    for log_e in evalues:
        u = rng.random()
        if combine_for_run is not None:
            monkeypatch.setattr(analysis, "combined_log_evalue", combine_for_run(u))
        for alpha in ANYTIME_ALPHAS:
            result = analysis.stop_sequentially(lambda trials, a: CaseResult("g", "", "step", "s", p_value=1.0),
                                                log_e, alpha, final=True, exact_failure_seen=False)
            failures[alpha] += result.p_value <= alpha
    return [rate_check(failures[a], len(evalues), a / 2, ANYTIME_LEVEL) for a in ANYTIME_ALPHAS]


def test_anytime_evalue_null_rate_a_5x_test_and_broken_combinations_are_caught(monkeypatch):
    """The averaged e-process, watched after every trial, rejects null rounds within its alpha share
    (measured: about half of it). Check error rate <= 1e-4. Broken variants, each failing the check:

    - a sequential test whose false-failure rate is 5x nominal (the e-process also "crosses" on an
      independent event of probability ``5 alpha / 2``): the check's power against that rate is
      >= 0.9999 at alpha 0.1 (0.25 against 0.05);
    - the e-value rows (one per position, and their product) combined by their maximum, or by their
      sum (no division by their number), instead of their mean: neither is an e-process; on these
      rounds they cross ``2 / alpha`` at alpha 0.4 in about 0.35 (maximum) and 0.56 (sum) of null
      runs against the 0.2 allowed (measured on 3000 other rounds); the check's power against any
      rate >= 0.3 is >= 0.9999.

    (One test: under pytest-xdist a module fixture would be computed again by each worker.)"""
    from scipy.special import logsumexp as lse

    from lossless_check.evidence.analysis import combined_log_evalue

    evalues = null_evalues()
    rows = anytime_null_check(evalues, monkeypatch)
    assert not any(row["fails"] for row in rows), rows
    assert check_power(ANYTIME_RUNS, ANYTIME_ALPHAS[0] / 2, ANYTIME_LEVEL, 5 * ANYTIME_ALPHAS[0] / 2) >= 0.9999
    assert check_power(ANYTIME_RUNS, ANYTIME_ALPHAS[1] / 2, ANYTIME_LEVEL, 0.3) >= 0.9999

    five_x = lambda u: lambda log_e: np.maximum(combined_log_evalue(log_e), np.log(5 / u))
    broken = anytime_null_check(evalues, monkeypatch, five_x)
    assert all(row["fails"] for row in broken), broken
    combinations = {"max": lambda u: lambda log_e: log_e.max(axis=0), "sum": lambda u: lambda log_e: lse(log_e, axis=0)}
    for name, combine in combinations.items():
        broken = anytime_null_check(evalues, monkeypatch, combine)
        assert broken[1]["fails"], (name, broken)
