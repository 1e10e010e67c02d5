"""Greedy mode: do_sample=False through the real generate() loop equals plain greedy decoding, exactly.

Built-ins give their release verdict (per-release spans below and in fixtures/releases.py), a mutant
that changes only the target's repetition penalty is caught under that processor alone, every pair
of greedy processors is run, every processor moves the greedy path of markov8, and a case that no
bug could change says so (vacuous).
"""

import itertools

import pytest
import torch

from fixtures.releases import (ASSISTED_STALE_CACHE_POSITION, PROMPT_LOOKUP_CRASHES_WITHOUT_EOS,
                               PROMPT_LOOKUP_OVERSHOOTS, needs, within)
from lossless_check.subjects.adapters import resolve_generator
from lossless_check.faces.api import cases_for
from lossless_check.modes import greedy
from lossless_check.modes.greedy import (
    GREEDY_OPTIONS, Comparison, _Argmax, _verdict, greedy_stacks, prompts_for, run_greedy_case,
)
from lossless_check.modes.loop_models import (
    ASSISTED, DFLASH, DIFFERENT_TOKENIZERS, EARLY_EXIT, MTP, PROMPT_LOOKUP, SINGLE_POSITION, UNIVERSAL,
)
from lossless_check.modes.tiny_llama import TINY_LLAMA
from lossless_check.faces.mutant_catalog import GREEDY_MUTANTS
from lossless_check.faces.mutation import run_greedy_mutant
from lossless_check.evidence.results import Case
from lossless_check.laws.scenarios import DEFAULT, IID
from lossless_check.laws.stubs import fixed_logits_lm

#: generate() raises on these families under some greedy stacks (transformers defects), as
#: [first, first fixed) and a word of the error.
GREEDY_RAISES = {
    # AssistedCandidateGeneratorDifferentTokenizers hands the target's own LogitsProcessorList to the
    # assistant's generate() (5.24.0 candidate_generator.py line 320). SequenceBiasLogitsProcessor and
    # NoBadWordsLogitsProcessor size their bias by the first logits they see (logits_process.py lines
    # 1322 and 1361, once: 1386): the assistant's vocabulary (10 here), then the target's (8) at
    # verification, line 1329: "The size of tensor a (8) must match the size of tensor b (10)". Every
    # stack with bad_words_ids or sequence_bias, whenever the two vocabularies differ in size.
    # Examined on 5.13.1, 5.14.1 and 5.24.0 (all raise); earlier releases not yet examined.
    DIFFERENT_TOKENIZERS: (("5.13.1", None), "must match the size"),
    # (EarlyExit 5.0-5.2 and SinglePosition 5.18-5.19 raise in every call: tests/test_generate_mode.py RAISES.)
    EARLY_EXIT: (("5.0.0", "5.3.0"), "is_first_iteration"),
    SINGLE_POSITION: (("5.18.0", "5.20.0"), "missing 2 required positional arguments"),
}


#: Prompt lookup emits nothing after a prompt that ends in EOS when its first round finds no match: up to
#: 5.17 a round without drafts checks the stopping criteria on the prompt itself (``is_done_candidate``,
#: as for DFlash and MTP in tests/test_generate_mode.py STOPPING_DEFECTS). Seen on 5.14.1 (markov8, prompt
#: [6, 0, 5] under min_new_tokens=5 with EOS 5: nothing, plain greedy [2, 4, 2, 4, 2]); before 5.14 the
#: overshoot below already makes the row not lossless; 5.24.0 passes (5.18.0 dropped is_done_candidate).
PROMPT_LOOKUP_NOTHING_AFTER_EOS_PROMPT = ("5.14.0", "5.18.0")


def expected_verdicts(family: str, scenario_name: str = "markov8") -> set[str]:
    """The greedy verdicts ``family`` may give on the installed release."""
    generator = resolve_generator(family)
    if generator.generator_class is None or family == UNIVERSAL:
        return {"skipped"}
    if family in GREEDY_RAISES and within(GREEDY_RAISES[family][0]):
        return {"error"}
    if family == PROMPT_LOOKUP and any(within(span) for span in (
            PROMPT_LOOKUP_OVERSHOOTS, PROMPT_LOOKUP_CRASHES_WITHOUT_EOS, PROMPT_LOOKUP_NOTHING_AFTER_EOS_PROMPT)):
        # One token past max_new_tokens where a partly accepted draft reaches max_length (4.40-5.13; measured:
        # 14 of 116 comparisons on 5.13.1, 15 on 4.40.2), 5.0-5.12's isin(chosen_ids, None) on stacks
        # without EOS, nothing after an EOS prompt (5.14-5.17): a mismatch outranks an error.
        return {"not_lossless", "error"}
    if family == ASSISTED and scenario_name == TINY_LLAMA.name and within(ASSISTED_STALE_CACHE_POSITION):
        return {"not_lossless"}  # 4.40.2: 14 of 32 comparisons differ (markov8 passes: the stubs ignore positions)
    return {"lossless"}


def greedy_case(spec, scenario=DEFAULT, warpers=None):
    return run_greedy_case(Case(resolve_generator(spec), warpers or {}, "greedy", scenario), seed=0)


@pytest.mark.parametrize("family", [ASSISTED, PROMPT_LOOKUP])
def test_assisted_and_prompt_lookup_give_plain_greedy_tokens_on_every_stack(family):
    """The full row: 29 stacks (none, 7 processors alone, 21 pairs) x 4 prompts at 4 lengths."""
    result = greedy_case(family)
    assert result.verdict in expected_verdicts(family), result.reason
    facts = result.greedy_equivalence
    assert facts["comparisons"] == result.samples == 29 * greedy.PROMPTS
    assert result.p_value is None and result.alpha_case == 0.0 and "no share of alpha" in result.reason
    if result.verdict == "lossless":
        assert facts["differing"] == facts["raised"] == 0
        # Informative: drafts kept and rejected, and the argmax depends on the history at most positions.
        assert 0 < facts["accepted"] < facts["drafted"]
        assert facts["informative_positions"] > facts["positions"] / 2


@pytest.mark.parametrize("family", [EARLY_EXIT, SINGLE_POSITION, MTP, DFLASH, UNIVERSAL, DIFFERENT_TOKENIZERS])
def test_every_other_family_gives_its_release_verdict(family, monkeypatch):
    """One prompt per stack (29 comparisons; MTP loads its layers at every call): still every stack and length."""
    monkeypatch.setattr(greedy, "PROMPTS", 1)
    result = greedy_case(family)
    expected = expected_verdicts(family)
    assert result.verdict in expected, result.reason
    if expected == {"error"}:
        assert GREEDY_RAISES[family][1] in result.reason
    if family == DIFFERENT_TOKENIZERS and "error" in expected:
        facts = result.greedy_equivalence
        # Only the stacks with a sequence-bias processor raise; every other comparison is identical.
        raising = [c for c in greedy_stacks({}) if "bad_words_ids" in c or "sequence_bias" in c]
        assert facts["raised"] == len(raising) and facts["differing"] == 0
        assert facts["first_error"]["warpers"].startswith(("bad_words_ids", "sequence_bias"))
    if result.verdict == "lossless":
        assert result.greedy_equivalence["drafted"] > 0 and result.greedy_equivalence["informative_positions"] > 0


@needs(ASSISTED)
def test_tiny_llama_row_gives_plain_greedy_tokens_except_where_positions_go_stale():
    """A real model: the history comes from its KV cache and positions (4.39-4.40 verify later rounds at
    stale positions); each processor alone, no pairs (a forward pass per history)."""
    result = greedy_case(ASSISTED, TINY_LLAMA)
    assert result.verdict in expected_verdicts(ASSISTED, TINY_LLAMA.name), result.reason
    assert result.samples == (1 + len(GREEDY_OPTIONS)) * greedy.PROMPTS
    if result.verdict == "lossless":
        facts = result.greedy_equivalence
        assert 0 < facts["accepted"] < facts["drafted"]
        assert facts["informative_positions"] > 0.9 * facts["positions"]  # a real model's argmax reads its history


#: The mutant filters the processor list generate() hands AssistedCandidateGenerator: the one the loop
#: verifies with from 4.57.0, where _assisted_decoding builds the generator from its own
#: logits_processor argument (4.57.0 generation/utils.py, _get_candidate_generator called inside
#: _assisted_decoding, which generate() calls with prepared_logits_processor; caught on 5.14.1 and
#: 5.24.0); through 4.56.2 generate() hands it the user's list (4.56.2 line 2478, 4.40.2 line 1554)
#: and verifies with the prepared one, so the mutant changes nothing there.
SHARES_VERIFYING_PROCESSORS = ("4.57.0", None)
SHARING = pytest.mark.skipif(not within(SHARES_VERIFYING_PROCESSORS),
                             reason="the mutant's bug needs the generator to get the verifying processor list")


@needs(ASSISTED)
@SHARING
def test_mutant_dropping_the_targets_repetition_penalty_is_caught_under_that_processor_only(monkeypatch):
    bug, control = GREEDY_MUTANTS
    row = run_greedy_mutant(bug, seed=0)
    assert row["verdict"] == "not_lossless" and row["correct"], row["reason"]
    assert row["reason"].startswith("greedy output differs") and "[repetition_penalty=2.0" in row["reason"]
    differing = row["differing_stacks"]
    assert differing and all("repetition_penalty=2.0" in stack for stack in differing)
    # Not every repetition_penalty stack: where another processor already fixes the path, nothing moves.
    assert len(differing) < 1 + len(GREEDY_OPTIONS)
    monkeypatch.setattr(greedy, "PROMPTS", 1)
    row = run_greedy_mutant(control, seed=0)
    assert row["verdict"] == "lossless" and row["correct"], row["reason"]


def test_every_pair_of_greedy_processors_is_a_stack():
    stacks = greedy_stacks({})
    assert len(stacks) == 1 + len(GREEDY_OPTIONS) + len(GREEDY_OPTIONS) * (len(GREEDY_OPTIONS) - 1) // 2
    options = [{k for k in stack if k != "eos_token_id"} for stack in stacks]
    for a, b in itertools.combinations(GREEDY_OPTIONS, 2):
        assert {a, b} in options, (a, b)
    assert greedy_stacks({"top_k": 3})[0] == {"top_k": 3}  # a base stack under every one


def _plain_greedy(stack, prompt, max_new_tokens=11):
    from transformers import GenerationConfig

    from lossless_check.core.compat import release_warpers

    model = fixed_logits_lm(DEFAULT.target, prompt_length=len(prompt))
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, **release_warpers(stack))
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), generation_config=config)[0, len(prompt):].tolist()


def test_every_greedy_processor_moves_the_greedy_path_of_markov8():
    """A processor that never changes the argmax would test nothing. Each changes plain greedy decoding
    on some prompt of the row; min_new_tokens where EOS is the argmax: beside the length penalty."""
    prompts = prompts_for(Case(resolve_generator(ASSISTED), {}, "greedy", DEFAULT), seed=0)
    by_option = dict(zip(GREEDY_OPTIONS, greedy_stacks({}, pairs=False)[1:]))
    for option, stack in by_option.items():
        baseline = {"eos_token_id": stack["eos_token_id"]} if "eos_token_id" in stack else {}
        if option == "min_new_tokens":
            baseline = by_option["exponential_decay_length_penalty"]
            stack = {**baseline, **stack}
        assert any(_plain_greedy(stack, p) != _plain_greedy(baseline, p) for p in prompts), option


def test_informative_positions_need_a_history_dependent_argmax():
    history = DEFAULT.prompt + (2, 4)
    markov = _Argmax(lambda h: DEFAULT.target.emitted(len(h) - 3, h[-1]), [])
    iid = _Argmax(lambda h: IID.target.emitted(len(h) - 3, h[-1]), [])
    assert markov.informative(history, 8) and not iid.informative(history, 8)


def _comparison(speculative, plain, informative=3):
    return Comparison({}, (3, 1, 4), 3, speculative, plain, informative, len(plain))


@pytest.mark.parametrize("comparisons, loop, verdict, words", [
    ([_comparison([1, 2, 3], [1, 2, 3])], {"drafted": 4, "accepted": 2}, "lossless", "identical tokens"),
    ([_comparison([1, 2, 3], [1, 2, 3], informative=0)], {"drafted": 4, "accepted": 2}, "vacuous",
     "does not depend on the history"),
    ([_comparison([1, 2, 3], [1, 2, 3])], {"drafted": 0, "accepted": 0}, "vacuous", "proposed no draft"),
    ([_comparison([1, 2, 3, 4], [1, 2, 3])], {"drafted": 4, "accepted": 3}, "not_lossless",
     "at position 4 speculative decoding emits 4, plain greedy decoding nothing (stopped)"),
    ([_comparison([1, 5, 3], [1, 2, 3]), _comparison("RuntimeError: boom", [1, 2, 3])], {"drafted": 4, "accepted": 2},
     "not_lossless", "at position 2 speculative decoding emits 5, plain greedy decoding 2"),
    ([_comparison("RuntimeError: boom", [1, 2, 3])], {"drafted": 4, "accepted": 2}, "error", "RuntimeError: boom"),
])
def test_verdicts(comparisons, loop, verdict, words):
    result = _verdict(Case(resolve_generator(ASSISTED), {}, "greedy", DEFAULT).result(), comparisons,
                      {"calls": len(comparisons), "rounds": 1, **loop}, 1.0)
    assert result.verdict == verdict and words in result.reason, result.reason
    assert result.explain() == result.reason
    assert (result.failed_checks == ["greedy"]) == (verdict == "not_lossless")


def test_greedy_rows_join_the_main_job_and_greedy_mode_but_not_a_named_step_run():
    main = [c for c in cases_for(None, matrix="smoke") if c.mode == "greedy"]
    assert [(c.generator.spec, c.scenario.name) for c in main if c.scenario.name == "tiny-llama"] == [
        (ASSISTED, "tiny-llama"), (PROMPT_LOOKUP, "tiny-llama")]
    assert len([c for c in main if c.scenario.name == "markov8"]) == 8
    assert not [c for c in cases_for([ASSISTED], matrix="smoke") if c.mode == "greedy"]
    named = cases_for([ASSISTED], "repetition_penalty=1.5", mode="greedy", scenario="iid8")
    assert [(c.warpers, c.scenario.name) for c in named] == [({"repetition_penalty": 1.5}, "iid8")]


@SHARING
def test_cli_greedy_mode_reports_a_row_per_generator(tmp_path, monkeypatch):
    import json

    from lossless_check.faces.cli import main

    monkeypatch.setattr(greedy, "PROMPTS", 2)
    out = tmp_path / "report.json"
    code = main(["run", "--mode", "greedy", "--generator", GREEDY_MUTANTS[0].spec, "--scenario", "markov8",
                 "--no-verifier", "--quiet", "--json", str(out)])
    assert code == 1
    [row] = json.loads(out.read_text())["cases"]
    assert row["mode"] == "greedy" and row["verdict"] == "not_lossless"
    assert row["greedy_equivalence"]["first_difference"]["warpers"].startswith("repetition_penalty=2.0")
