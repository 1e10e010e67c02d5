"""The fuzzer finds bugs that need three warper options together, from any seed, within its default budget.

The controls are ``fixtures/mutants/three_option.py``: five kinds of wrong q, each only when its three
options are all set (no pairwise matrix stack triggers any of them). Four are visible to the exact
provenance pass; the fifth (Gumbel-max drafts from twice the logits it returns) is an interception gap
there, so only the statistical pass can find it.

Error rate: the exact finds have none (provenance); a statistical find is a rejection at the covering
stack's share of alpha (``fuzz``'s false-failure rate is at most its alpha, 1e-6, for a lossless
generator). What is asserted is power: 10 seeds out of 10.
"""

from __future__ import annotations

import pytest

from fixtures.releases import DFLASH, needs
from lossless_check.faces import fuzz_search, fuzzing
from lossless_check.laws.scenarios import SCENARIOS
from lossless_check.laws.warpers import format_warpers, parse_warpers
from lossless_check.strategies import AUXILIARY

SEEDS = range(10)
EXACT_KINDS = ["SharpQUnderTopPMinPBias", "RawQUnderTypicalEtaBadWords", "ShiftedQUnderTemperatureEpsilonSuppress",
               "FlatQUnderTopHRepetitionMinTokens"]
STATISTICAL_KIND = "GumbelSharpDraftsUnderTopKNgramDecay"


def trigger(name: str) -> set[str]:
    from fixtures.mutants import three_option

    return set(three_option.MUTANTS[name])


def no_pairwise_matrix_stack_triggers(name: str) -> bool:
    from lossless_check.laws.matrix import matrix

    return not any(trigger(name) <= set(stack) for stack in matrix("full"))


# heavy (.ci/run's first step): 40 searches, each ending in the exact pass's covering (about 5 s each on 2 cores).
@pytest.mark.heavy
@needs(DFLASH)
@pytest.mark.parametrize("name", EXACT_KINDS)
def test_an_exact_kind_is_found_and_shrunk_to_its_three_options_from_every_seed(name):
    assert no_pairwise_matrix_stack_triggers(name)
    for seed in SEEDS:
        result = fuzzing.fuzz(f"fixtures.mutants.three_option:{name}", seed=seed, database=None)
        assert result.verdict == "not_lossless" and "--mode provenance" in result.reproduce, (seed, result.summary())
        assert set(parse_warpers(result.stack)) - set(AUXILIARY) == trigger(name), (seed, result.stack)


# heavy (.ci/run's first step): a statistical covering pass to a trigger's stack (19 or 25 lossless stacks first,
# about 60 s of CPU); one test a seed, so that the ten spread over the suite's workers.
@pytest.mark.heavy
@pytest.mark.slow
@needs(DFLASH)
@pytest.mark.parametrize("seed", SEEDS)
def test_the_statistical_kind_is_found_by_the_covering_from_every_seed(seed):
    """The exact pass is blind to it (a gap at every stack); the statistical pass's covering finds it at a
    stack holding its trigger (there are two), from each of 10 seeds."""
    name = f"fixtures.mutants.three_option:{STATISTICAL_KIND}"
    assert no_pairwise_matrix_stack_triggers(STATISTICAL_KIND)
    covering = fuzz_search.covering_of(SCENARIOS[fuzzing.DEFAULT_SCENARIO])
    holding = {format_warpers(stack) for stack in covering.stacks if trigger(STATISTICAL_KIND) <= set(stack)}
    share = fuzzing.alpha_of_covering(fuzzing.DEFAULT_ALPHA, len(covering.stacks))
    examiner = fuzz_search.Examiner(name, fuzzing.DEFAULT_SCENARIO, fuzzing.DEFAULT_SAMPLES, fuzzing.DEFAULT_ALPHA,
                                 seed, lambda trials: None)
    found = fuzz_search.covering_pass(examiner, covering, lambda stack, phase: fuzz_search.statistical_failure(
        examiner.statistical(stack, phase, share)), shrink=False)
    assert found is not None, seed
    record, (verdict, _) = found
    assert verdict == "not_lossless" and record["stack"] in holding, (seed, record)


# heavy (.ci/run's first step): one whole search with its statistical shrinking.
@pytest.mark.heavy
@pytest.mark.slow
@needs(DFLASH)
def test_a_whole_search_finds_the_statistical_kind_and_shrinks_it_to_its_trigger():
    """``fuzz`` as a user runs it (exact pass, then statistical): not lossless, shrunk to the trigger's stack."""
    name = f"fixtures.mutants.three_option:{STATISTICAL_KIND}"
    result = fuzzing.fuzz(name, database=None)
    assert result.verdict == "not_lossless" and "--mode step" in result.reproduce, result.summary()
    assert not any(r.get("exact") == "inconsistent" for r in result.records)  # the exact pass cannot see it
    assert set(parse_warpers(result.stack)) - set(AUXILIARY) == trigger(STATISTICAL_KIND), result.stack
