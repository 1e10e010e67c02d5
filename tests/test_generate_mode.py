"""Generate mode: the real generate() loop passes built-in drafting; a loop-only mutant fails it but not step mode."""

import numpy as np
import pytest
import torch

from fixtures.mutants.loop_mutants import LOOP_SCENARIO
from lossless_check.adapters import resolve_generator
from lossless_check.expected import ExactLaws, first_token_law
from lossless_check.modes.generate import TINY_LLAMA, run_generate_case, stopping_violations, tiny_llama_pair
from lossless_check.api import run_cases as run
from lossless_check.results import Case
from lossless_check.scenarios import DEFAULT
from lossless_check.stubs import fixed_logits_lm
from lossless_check.warpers import capture_processors

ALPHA = 1e-6
ASSISTED = "AssistedCandidateGenerator"
SHIFTED_Q = "fixtures.mutants.loop_mutants:ShiftedQAfterFirstRound"
PAST_STOPS = "fixtures.mutants.loop_mutants:DraftsPastStops"
EOS = 4  # the DEFAULT drafter's favourite token at most positions: drafted mid-block often


def generate_case(generator, warpers, scenario, samples, max_new_tokens=4, seed=0):
    case = Case(resolve_generator(generator), warpers, "generate", scenario, max_new_tokens)
    return run_generate_case(case, samples, seed, ALPHA)


@pytest.mark.parametrize("warpers", [{"temperature": 0.7}, {"top_k": 3}, {"top_p": 0.7}, {"repetition_penalty": 1.5}])
def test_assisted_is_lossless_over_several_rounds(warpers):
    result = generate_case(ASSISTED, warpers, DEFAULT, samples=200)
    assert result.verdict == "lossless", result.reason
    assert result.mode == "generate" and len(result.positions) == 4
    assert result.mean_rounds > 1.5  # K=4 tokens take several drafting rounds
    assert result.samples_per_second > 0


@pytest.mark.parametrize("generator", [ASSISTED, PAST_STOPS])
def test_eos_and_max_length_cropping_are_lossless(generator):
    """EOS drafted mid-block, and (PAST_STOPS) drafts past EOS and max_length that the loop must crop."""
    result = generate_case(generator, {"eos_token_id": EOS}, DEFAULT, samples=250, max_new_tokens=5)
    assert result.verdict == "lossless", result.reason
    assert "stopping" not in result.failed_checks
    assert result.mean_new_tokens < 5  # EOS ends some outputs early
    assert result.positions[-1]["samples"] < result.positions[0]["samples"]


def test_tiny_llama_pair_is_lossless_under_top_p():
    result = generate_case(ASSISTED, {"top_p": 0.8}, TINY_LLAMA, samples=150)
    assert result.verdict == "lossless", result.reason
    assert result.mean_rounds > 1.5
    assert result.positions[3]["strata"] > 1  # a real model's law depends on the whole prefix


def shifted_q_tv_at_position_2() -> float:
    """Exact TV of the second emitted token for ShiftedQAfterFirstRound on LOOP_SCENARIO (K=4, no warpers).

    The second token comes from round 2 iff round 1 rejected its first draft (probability ``1 - a0``,
    ``a0 = sum min(p, q0)``). Round 2 then drafts from ``q1`` but returns the stale row ``q2`` (round
    1's last draft row), so that token follows ``first_token_law(p, q1, q2)``; otherwise it follows
    ``p``. The target is i.i.d., so all samples form one stratum with law ``p``.
    """
    target = fixed_logits_lm(LOOP_SCENARIO.target, len(LOOP_SCENARIO.prompt))
    processors, _ = capture_processors(target, torch.tensor([LOOP_SCENARIO.prompt]), {}, 4)
    laws = ExactLaws(LOOP_SCENARIO, processors)
    p, q0, q1, q2 = laws.target(), laws.drafter(()), laws.drafter((0,)), laws.drafter((0, 0))
    a0 = np.minimum(p, q0).sum()
    return float((1 - a0) * 0.5 * np.abs(first_token_law(p, q1, q2) - p).sum())


def test_loop_mutant_passes_step_mode_but_fails_generate_mode():
    true_tv = shifted_q_tv_at_position_2()

    step = run([Case(resolve_generator(SHIFTED_Q), {}, scenario=LOOP_SCENARIO)], 500, ALPHA, seed=0, sequential=False).cases[0]
    assert step.verdict == "lossless", step.reason
    # Step mode would have seen an error this large in the round it tests: the bug is outside it.
    assert step.tv_detectable < true_tv

    generate = generate_case(SHIFTED_Q, {}, LOOP_SCENARIO, samples=500)
    assert generate.positions[1]["tv_detectable"] < true_tv  # detected with probability >= 0.99
    assert generate.verdict == "not_lossless"
    assert "output_law@2" in generate.failed_checks
    assert "output_law@1" not in generate.failed_checks  # round 1 is honest


def test_stopping_rules():
    eos = frozenset({EOS})
    assert stopping_violations([1, 2, 3, 5], 4, eos) == 0
    assert stopping_violations([1, EOS], 4, eos) == 0
    assert stopping_violations([1, 2], 4, eos) == 1  # stopped early without EOS
    assert stopping_violations([EOS, 2, 3, 5], 4, eos) == 1  # a token after EOS
    assert stopping_violations([1, 2, 3, 5, 6], 4, eos) == 1  # past max_new_tokens


def test_tiny_llama_pair_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, _ = tiny_llama_pair(3)
    b, drafter = tiny_llama_pair(3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.lm_head.weight, drafter.lm_head.weight)


def test_other_generator_families_are_skipped():
    result = generate_case("DFlashTokenCandidateGenerator", {}, DEFAULT, samples=10)
    assert result.verdict == "skipped" and "assistant_model" in result.reason


def test_prompt_lookup_through_the_real_loop_is_lossless():
    """Prompt lookup returns no q, so only generate mode can test it: the target verifies by sampling."""
    result = generate_case("PromptLookupCandidateGenerator", {"top_k": 3}, DEFAULT, samples=200)
    assert result.verdict == "lossless", result.reason
    assert result.mean_rounds < 4  # some drafts were accepted: the lookup path really ran


def test_generate_cases_give_the_same_results_on_any_number_of_workers():
    cases = [Case(resolve_generator(g), w, "generate", DEFAULT)
             for g in (ASSISTED, "PromptLookupCandidateGenerator") for w in ({"top_k": 3}, {"temperature": 0.7})]

    def summary(workers):
        return [(r.verdict, r.tv, r.p_value, r.mean_rounds)
                for r in run(cases, 60, ALPHA, 0, workers=workers).cases]

    assert summary(1) == summary(2)
