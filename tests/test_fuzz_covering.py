"""The fuzzer's strength-3 covering: every triple of warper options in a stack where a wrong q can show.

Exact, from the laws (no sampling, no error rate): every covering stack is q-informative on ``markov8``
(at some prefix a round reaches, the processed target and drafter laws both keep two tokens or more), and
the stacks hold all 455 triples of the 15 catalog options. Negative controls: a stack of the shape the
random search used to draw (many options at strong values) holds a mutant's triple yet is not
q-informative, and there the mutant's wrong q is exactly invisible (provenance: max TV 0); at its covering
stack the same mutant is caught.
"""

from __future__ import annotations

import itertools

import pytest

from fixtures.releases import DFLASH, needs
from lossless_check.evidence.results import Case
from lossless_check.faces.fuzz_search import covering_of
from lossless_check.laws.matrix import available_catalog
from lossless_check.laws.scenarios import SCENARIOS
from lossless_check.modes.covering import MAX_OPTIONS, TIMES, q_informative, triple_covering, triples_of
from lossless_check.modes.informativeness import q_informative_positions
from lossless_check.modes.provenance import provenance_check
from lossless_check.strategies import AUXILIARY
from lossless_check.subjects.adapters import resolve_generator

MARKOV8 = SCENARIOS["markov8"]


def test_every_triple_of_options_is_held_by_a_small_q_informative_stack():
    covering = covering_of(MARKOV8)
    options = [e.option for e in available_catalog()]
    assert covering.options == options and not covering.uncovered
    held: dict[tuple, list[set]] = {}
    for stack in covering.stacks:
        assert len([k for k in stack if k not in AUXILIARY]) <= MAX_OPTIONS, stack
        assert q_informative_positions(MARKOV8, stack), stack
        for triple in triples_of(stack, options):
            held.setdefault(triple, []).append(set(stack) - set(triple))
    assert set(held) == set(itertools.combinations(options, 3))
    assert covering.triples == len(held) == 455 and len(covering.stacks) == 50  # the docs' figures
    # Twice each, beside different options (a generator's own law can be narrower at one of them).
    assert all(len(beside) >= TIMES and len({frozenset(b) for b in beside}) >= TIMES for beside in held.values())


def test_the_covering_is_a_function_of_the_scenario_and_the_catalog():
    again = triple_covering(MARKOV8, available_catalog())
    assert again.stacks == covering_of(MARKOV8).stacks


#: A stack of the kind a dense random draw makes (9 options, several strong truncations) that holds
#: SharpQUnderTopPMinPBias's triple.
DENSE = {"temperature": 0.5, "top_k": 2, "top_p": 0.4, "min_p": 0.3, "typical_p": 0.5, "epsilon_cutoff": 0.1,
         "repetition_penalty": 2.5, "sequence_bias": [[[1], 2.0]], "suppress_tokens": [4]}


@needs(DFLASH)
def test_a_mutants_triple_in_a_stack_that_is_not_q_informative_shows_nothing_and_its_covering_stack_does():
    """The criterion is what matters: where the laws leave a point mass the mutant's doubled q is the same
    point mass (provenance max TV 0, the issue's "max TV 0"), at its covering stack it differs."""
    mutant = resolve_generator("fixtures.mutants.three_option:SharpQUnderTopPMinPBias")
    assert not q_informative(MARKOV8, DENSE)
    dense = provenance_check(Case(mutant, DENSE, scenario=MARKOV8), trials=3)
    assert dense.verdict == "consistent" and max(p.tv for p in dense.positions) == 0, dense.reason
    trigger = mutant.generator_class.TRIGGER
    covering = next(s for s in covering_of(MARKOV8).stacks if all(o in s for o in trigger))
    caught = provenance_check(Case(mutant, covering, scenario=MARKOV8), trials=3)
    assert caught.verdict == "inconsistent", caught.reason


@pytest.mark.parametrize("stack, informative", [
    ({}, True),
    ({"top_k": 1}, False),  # the target a point mass everywhere
    (DENSE, False),
])
def test_the_q_informative_criterion(stack, informative):
    assert bool(q_informative_positions(MARKOV8, stack)) is informative
