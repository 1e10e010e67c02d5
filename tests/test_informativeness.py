"""Vacuous cases: a stack that leaves the target a point mass wherever a trial reaches is reported
``vacuous`` (never ``lossless``), gets no share of the run's alpha, and a partly informative case names
the positions its evidence comes from."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lossless_check.subjects.adapters import resolve_generator
from lossless_check.faces.api import run_cases
from lossless_check.modes.sample_size import samples_to_detect
from lossless_check.modes.informativeness import case_informative_positions, informative_positions
from lossless_check.evidence.results import Case, CaseResult, RunResult, decide
from lossless_check.laws.scenarios import SCENARIOS
from lossless_check.strategies import informative_stacks
from fixtures.releases import DFLASH, assisted_samples, needs

ASSISTED = "AssistedCandidateGenerator"
#: Point mass at every reachable prefix of markov8's round (the solo catalog values of three truncations).
VACUOUS = {"top_k": 3, "typical_p": 0.6, "top_h": 0.5, "bad_words_ids": [[2], [4, 1]]}
#: A point mass at position 1 on a token markov8's processed drafter never drafts: positions 2-4 are
#: informative by the laws, but no round of a correct drafter reaches them.
UNREACHED = {"temperature": 0.6, "top_k": 3, "top_p": 0.7, "min_p": 0.15}
#: A point mass at every reachable prefix of positions 2 and 4 only.
PARTLY = {"top_p": 0.7, "no_repeat_ngram_size": 1, "sequence_bias": [[[1], 2.0], [[4, 2], -3.0]]}
ALPHA = 1e-6


def _point(token, vocab=3):
    law = np.zeros(vocab)
    law[token] = 1.0
    return law


def test_informative_positions_follow_reachable_prefixes():
    flat = np.full(3, 1 / 3)
    # Point masses everywhere: nothing informative.
    assert informative_positions(lambda prefix: _point(len(prefix) % 3), 4) == []
    # Informative after token 2 only, which position 1 never emits: still vacuous.
    assert informative_positions(lambda prefix: flat if prefix[-1:] == (2,) else _point(0), 4) == []
    # Two tokens at position 1, then a point mass after 0 and an even split after 1.
    law = lambda prefix: {(): np.array([0.5, 0.5, 0]), (0,): _point(0)}.get(prefix, flat)  # noqa: E731
    assert informative_positions(law, 3) == [1, 2, 3]
    # Nothing follows a stop token: with 1 one, position 2 is reached only after 0 (a point mass).
    assert informative_positions(law, 3, stop_tokens=frozenset({1})) == [1, 3]
    assert informative_positions(law, 3, stop_tokens=frozenset({0, 1})) == [1]
    # A drafter that never drafts 1: prefix (1,) is no accepted draft.
    assert informative_positions(law, 3, drafter_of=lambda prefix: np.array([1.0, 0, 0])) == [1, 3]
    # Past the budget, undecided positions count as informative (a vacuity claim must be proven).
    assert informative_positions(lambda prefix: _point(0), 4, budget=2) == [1, 2, 3, 4]


def test_case_plans_on_markov8():
    generator = resolve_generator(ASSISTED)
    assert case_informative_positions(Case(generator, VACUOUS)) == []
    assert case_informative_positions(Case(generator, PARTLY)) == [1, 3]
    assert case_informative_positions(Case(generator, {})) == [1, 2, 3, 4]
    assert case_informative_positions(Case(generator, VACUOUS, mode="provenance")) is None
    # Generate mode: the first K emitted tokens.
    assert case_informative_positions(Case(generator, VACUOUS, mode="generate", max_new_tokens=2)) == []


@assisted_samples()
def test_vacuous_cases_are_never_lossless_and_get_no_alpha():
    """Negative control for the verdict: a built-in generator under a vacuous stack (and under one no
    round reaches informatively) is ``vacuous``, with why; beside them an informative case and a
    skipped one, the alpha is split over the informative case alone."""
    generator = resolve_generator(ASSISTED)
    # DFlash drafts through the target's own head: a padded drafter head does not apply; DifferentTokenizers
    # is built for greedy decoding only (both skipped before running; tests/test_no_q.py: the probe's finds).
    skipped = [Case(resolve_generator("DFlashTokenCandidateGenerator"), {}, scenario=SCENARIOS["iid8-padded-drafter"]),
               Case(resolve_generator("AssistedCandidateGeneratorDifferentTokenizers"), {"top_k": 3})]
    cases = [Case(generator, VACUOUS), Case(generator, UNREACHED), Case(generator, PARTLY), Case(generator, {})]
    run = run_cases(cases + skipped, 500, ALPHA, 0)
    vacuous, unreached, partly, plain = run.cases[:4]
    assert [r.verdict for r in run.cases[4:]] == ["skipped", "skipped"]
    assert vacuous.verdict == unreached.verdict == "vacuous"
    assert vacuous.informative_positions == [] and vacuous.law_informative_positions == []
    assert vacuous.p_value is None and vacuous.tv_detectable is None and vacuous.alpha_case == 0.0
    assert "point mass at every reachable prefix of positions 1-4" in vacuous.reason
    assert unreached.law_informative_positions == [2, 3, 4] and unreached.informative_positions == []
    assert "no trial reached a prefix" in unreached.reason and unreached.tv_detectable is None
    # The two informative-by-law cases share the alpha (the unreached one only learns it is vacuous
    # by running); the vacuous and any skipped case get none.
    assert partly.alpha_case == plain.alpha_case == unreached.alpha_case == ALPHA / 3
    assert partly.verdict == plain.verdict == "lossless"
    assert partly.informative_positions == [1, 3] and "evidence from positions 1, 3 only" in partly.reason
    assert plain.informative_positions == [1, 2, 3, 4] and "evidence from" not in plain.reason
    assert run.counts()["vacuous"] == 2
    # DFlash and DifferentTokenizers were not checked at all (every case skipped): no answer for them, so exit 5.
    assert run.exit_code == 5 and set(run.unchecked()) == {"DFlashTokenCandidateGenerator",
                                                           "AssistedCandidateGeneratorDifferentTokenizers"}


@needs(DFLASH)
def test_an_exact_failure_in_a_vacuous_case_is_not_lossless():
    """q laid out one token off: under a point-mass target every draft has returned q = 0."""
    mutant = resolve_generator("lossless_check.mutants.dflash_vocabulary:DFlashPermutedVocabQ")
    result = run_cases([Case(mutant, VACUOUS)], 300, ALPHA, 0).cases[0]
    assert result.verdict == "not_lossless" and "impossible_draft" in result.failed_checks
    assert "point mass at every reachable prefix" in result.reason


def test_a_vacuous_generate_case_is_vacuous():
    """Generate mode tests the first K emitted tokens of the real loop: a point mass at each is vacuous."""
    case = Case(resolve_generator(ASSISTED), VACUOUS, mode="generate", max_new_tokens=2)
    result = run_cases([case], 60, ALPHA, 0).cases[0]
    assert result.verdict == "vacuous" and result.informative_positions == [] and result.p_value is None
    assert "positions 1-2" in result.explain()


def test_holm_family_leaves_out_cases_vacuous_by_the_laws():
    def ran(p, law):
        result = CaseResult("G", "w", "step", "markov8", p_value=p, law_informative_positions=law,
                            informative_positions=law)
        result.positions = [{"position": j, "tv": 0.0, "tv_detectable": 0.1, "p_value": p} for j in (1, 2, 3, 4)]
        return result

    # Two tested cases: Holm compares the smallest p with alpha / 2, not alpha / 3.
    results = [ran(0.4 * ALPHA, [1, 2, 3, 4]), ran(1.0, []), ran(0.9, [1])]
    decide(results, ALPHA)
    assert [r.verdict for r in results] == ["not_lossless", "vacuous", "lossless"]
    assert results[0].p_value_adjusted == pytest.approx(0.8 * ALPHA)
    assert RunResult(results, ALPHA, 0, 1).counts()["vacuous"] == 1


def test_samples_to_detect_counts_only_cases_that_can_give_evidence():
    generator = resolve_generator(ASSISTED)
    informative = [Case(generator, {}), Case(generator, {"top_k": 3})]
    assert samples_to_detect(informative + [Case(generator, VACUOUS)], 0.1, ALPHA) == samples_to_detect(
        informative, 0.1, ALPHA)
    assert samples_to_detect(informative, 0.1, ALPHA) > samples_to_detect(informative[:1], 0.1, ALPHA)


@settings(max_examples=5, deadline=None)
@given(informative_stacks(st.sampled_from([VACUOUS, PARTLY, {"top_k": 3}])))
def test_informative_stacks_strategy_drops_vacuous_stacks(stack):
    assert stack != VACUOUS


def test_assert_lossless_fails_a_vacuous_check_unless_allowed(lossless):
    with pytest.raises(pytest.fail.Exception, match="vacuous: the processed target is a point mass"):
        lossless.assert_lossless(ASSISTED, VACUOUS, scenario="markov8", samples=200)
    result = lossless.assert_lossless(ASSISTED, VACUOUS, scenario="markov8", samples=200, allow_vacuous=True)
    assert result.verdict == "vacuous"
    assert lossless.check(ASSISTED, VACUOUS, scenario="markov8", samples=200).verdict == "vacuous"
