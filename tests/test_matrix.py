"""The warper catalog: every entry changes the target law of the default scenario (it bites)."""

import itertools

import numpy as np
import pytest
import torch

from fixtures.releases import DECAY_PENALTY_NAN_AFTER_MASKED_EOS, within
from lossless_check.core.errors import PlainSamplingFails
from lossless_check.laws.expected import ExactLaws
from lossless_check.modes.informativeness import pair_coverage, reference_informative_positions
from lossless_check.laws.matrix import available_catalog, matrix, pairwise_stacks
from lossless_check.laws.scenarios import DEFAULT
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.laws.warpers import capture_processors, format_warpers, parse_warpers


def _laws(warpers):
    target = fixed_logits_lm(DEFAULT.target, len(DEFAULT.prompt))
    processors, _ = capture_processors(target, torch.tensor([DEFAULT.prompt]), warpers, 64)
    return ExactLaws(DEFAULT, processors)


def _max_tv_over_prefixes(a: ExactLaws, b: ExactLaws, depth: int = 2) -> float:
    vocab = DEFAULT.vocab_size
    prefixes = [p for d in range(depth + 1) for p in itertools.product(range(vocab), repeat=d)]
    return max(0.5 * np.abs(a.target(p) - b.target(p)).sum() for p in prefixes)


@pytest.mark.parametrize("entry", available_catalog(), ids=lambda e: e.option)
def test_each_catalog_entry_bites(entry):
    """Within two drafted positions, the entry moves the target law by at least 0.02 in TV, alone at
    its solo value and at the milder value it takes in stacks."""
    plain = _laws({"top_k": 0})
    assert _max_tv_over_prefixes(plain, _laws(entry.kwargs)) > 0.02
    assert _max_tv_over_prefixes(plain, _laws(entry.stacked_kwargs)) > 0.02


def test_catalog_specs_round_trip_through_the_parser():
    for entry in available_catalog():
        assert parse_warpers(format_warpers(entry.kwargs)) == entry.kwargs


def test_pairwise_stacks_cover_every_pair():
    entries = available_catalog()
    stacks = pairwise_stacks(entries)
    for a, b in itertools.combinations(entries, 2):
        both = {**a.stacked_kwargs, **b.stacked_kwargs}
        assert any(all(s.get(k) == v for k, v in both.items()) for s in stacks), (a.option, b.option)


@pytest.mark.parametrize("name", ["default", "full"])
def test_every_pair_of_options_is_covered_by_an_informative_stack(name):
    """Computed from the exact laws: each pair of catalog options (105 where the release has all 15) has a
    stack holding both that is not a point mass at every prefix a round drafting from markov8's drafter
    reaches, unless plain sampling itself fails on the installed release under every stack holding the
    pair (:data:`~fixtures.releases.DECAY_PENALTY_NAN_AFTER_MASKED_EOS`); the default matrix has no vacuous
    stack at all (a vacuous stack costs a case and tests nothing)."""
    options = [e.option for e in available_catalog()]
    coverage = pair_coverage(matrix(name), options, DEFAULT)
    assert coverage.total == len(options) * (len(options) - 1) // 2
    assert coverage.covered + len(coverage.unsampleable) == coverage.total, coverage
    assert bool(coverage.unsampleable) == within(DECAY_PENALTY_NAN_AFTER_MASKED_EOS), coverage.unsampleable
    for stack in matrix(name):
        try:
            informative = reference_informative_positions(DEFAULT, stack)
        except PlainSamplingFails:  # untestable on this release (not vacuous): only for the known defect
            assert within(DECAY_PENALTY_NAN_AFTER_MASKED_EOS) and "exponential_decay_length_penalty" in stack
            continue
        assert informative or name != "default", stack


def test_pair_coverage_counts_only_informative_stacks():
    """Negative control: the solo values stacked four at a time (the former design) leave pairs that only
    vacuous stacks hold."""
    entries = {e.option: e for e in available_catalog()}
    vacuous = {**entries["top_k"].kwargs, **entries["typical_p"].kwargs, "bad_words_ids": [[2], [4, 1]]}
    assert reference_informative_positions(DEFAULT, vacuous) == []
    assert pair_coverage([vacuous], ["top_k", "typical_p", "bad_words_ids"], DEFAULT) == (0, 3, [])
    assert pair_coverage([matrix("default")[-1]], list(entries), DEFAULT).covered > 0
    # A stack under which plain sampling fails on every release (every token banned) covers nothing,
    # and its pairs are named as untestable, not as left out by the matrix.
    banned = {**entries["top_k"].kwargs, "bad_words_ids": [[token] for token in range(DEFAULT.vocab_size)]}
    assert pair_coverage([banned], ["top_k", "bad_words_ids"], DEFAULT) == (0, 1, [("bad_words_ids", "top_k")])


def test_default_matrix_holds_every_single_entry():
    default = matrix("default")
    assert {} in default
    for entry in available_catalog():
        assert entry.kwargs in default
    assert len(matrix("full")) > len(default) > len(matrix("smoke"))


def test_named_matrices_add_their_real_world_cases_on_the_default_scenario_only():
    from lossless_check.faces.api import cases_for
    from lossless_check.laws.matrix import REAL_WORLD_SLICES

    generator = "AssistedCandidateGenerator"
    default = cases_for(generator, matrix="default")
    extra = [(c.scenario.name, c.warpers, c.mode) for c in default if c.scenario.name != "markov8"]
    assert extra == [(name, stack, "step") for name, stack in REAL_WORLD_SLICES]
    assert ("zipf32k", {"top_p": 0.9}, "step") in extra
    # A named scenario runs every stack there and nothing else; smoke adds nothing; generate mode adds no
    # real-world case, but the stateful targets (tests/test_stateful.py).
    from lossless_check.laws.scenarios import STATEFUL

    assert {c.scenario.name for c in cases_for(generator, matrix="default", scenario="iid8")} == {"iid8"}
    assert {c.scenario.name for c in cases_for(generator, matrix="smoke")} == {"markov8"}
    assert {c.scenario.name for c in cases_for(generator, matrix="default", mode="generate")} == (
        {"markov8"} | {s.name for s in STATEFUL.values()})
    # With mode all the real-world cases carry provenance beside step (mode all), not generate.
    assert {c.mode for c in cases_for(generator, matrix="default", mode="all")
            if c.scenario.name != "markov8" and c.scenario.target_kind is None} == {"all"}
