"""Options mode: what generate() returns and streams beside the tokens, exactly; the heuristic schedule's restore."""

import copy
from types import SimpleNamespace

import torch

from lossless_check.faces.api import cases_for
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.laws.warpers import capture_processors
from lossless_check.modes.generate import _setup
from lossless_check.modes.loop_options import (
    OUTPUT_OPTIONS,
    RecordingStreamer,
    _heuristic,
    check_call,
    run_options_case,
)


def _one_call():
    [case] = cases_for(["PromptLookupCandidateGenerator"], mode="options")
    setup = _setup(case, case.max_new_tokens)
    config = copy.deepcopy(setup.generation_config)
    for key, value in OUTPUT_OPTIONS.items():
        setattr(config, key, value)
    config.output_attentions = False  # the stub returns none (options mode adds them by a hook)
    streamer = RecordingStreamer()
    torch.manual_seed(0)
    out = setup.target.generate(setup.prompt_ids, generation_config=config, streamer=streamer, **setup.generate_kwargs)
    scenario = case.scenario
    plain = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
    processors, _ = capture_processors(plain, setup.prompt_ids, case.warpers, case.max_new_tokens)
    return out, streamer, list(scenario.prompt), plain, processors


def test_a_correct_call_agrees_and_tampered_outputs_do_not():
    out, streamer, prompt, plain, processors = _one_call()
    assert check_call(out, streamer, prompt, plain, processors) == []
    # Negative controls: each kind of disagreement is reported.
    shifted = copy.copy(out)
    shifted.scores = (out.scores[-1],) + tuple(out.scores[:-1])
    assert any("scores[" in p for p in check_call(shifted, streamer, prompt, plain, processors))
    raw = copy.copy(out)
    raw.scores = out.logits  # raw logits returned as scores: the processors (top_k, temperature) not applied
    assert any("processed scores" in p for p in check_call(raw, streamer, prompt, plain, processors))
    short = RecordingStreamer()
    short.puts, short.ends = streamer.puts[:-1], streamer.ends
    assert any("streamer" in p for p in check_call(out, short, prompt, plain, processors))
    fewer = copy.copy(out)
    fewer.logits = out.logits[:-1]
    assert any(p.startswith("logits:") for p in check_call(fewer, streamer, prompt, plain, processors))


def test_the_restored_schedule_is_checked():
    assistant = SimpleNamespace(generation_config=SimpleNamespace(num_assistant_tokens=7))
    assert _heuristic(assistant, [SimpleNamespace(num_assistant_tokens=7)]) is None
    assert "ended at 9" in _heuristic(assistant, [SimpleNamespace(num_assistant_tokens=9)])


def test_options_case_of_the_assisted_family():
    [case] = cases_for(["AssistedCandidateGenerator"], mode="options")
    result = run_options_case(case, seed=0)
    assert result.verdict == "lossless", result.reason
    assert "heuristic draft schedule" in result.reason
    assert "lossy by design" in result.reason  # the greedy ensemble weight is never called lossless


def test_shapes_are_compared_with_plain_decodings():
    from lossless_check.modes.loop_options import shape_problems

    def out(**fields):
        return SimpleNamespace(**{name: fields.get(name) for name in
                                  ("attentions", "hidden_states", "decoder_attentions", "cross_attentions",
                                   "decoder_hidden_states")})

    per_token = ((torch.zeros(1, 4, 3, 3),), (torch.zeros(1, 4, 1, 3),))
    assert shape_problems(out(cross_attentions=per_token), out(cross_attentions=per_token)) == []
    # Negative control: weights split along the heads instead of the queries (5.25's _split_model_outputs).
    split = ((torch.zeros(1, 3, 6, 3),), (torch.zeros(1, 1, 6, 3),))
    [problem] = shape_problems(out(cross_attentions=split), out(cross_attentions=per_token))
    assert problem.startswith("cross_attentions[0] has shapes [(1, 3, 6, 3)]")
    assert shape_problems(out(), out(attentions=per_token)) == [
        "attentions: none returned where plain decoding returns some"]


def test_cache_kinds_roll_back_and_a_crop_that_does_nothing_is_caught():
    from unittest import mock

    from lossless_check.laws.scenarios import SCENARIOS
    from lossless_check.modes import cache_kinds
    from lossless_check.modes.loop_options import _greedy

    [case] = cases_for(["AssistedCandidateGenerator"], mode="options")
    config = _greedy(_setup(case, case.max_new_tokens))
    problems, kinds = cache_kinds.check_cache_kinds(SCENARIOS["markov8"], config)
    assert problems == [] and "StaticLayer" in kinds and "DynamicSlidingWindowLayer" in kinds
    # Negative control: layers whose crop keeps the rejected drafts (a rollback bug) give other tokens.
    absolute = cache_kinds.absolute_positions

    def keeping_drafts(layer_class):
        return type("KeepsDrafts", (absolute(layer_class),), {"crop": lambda self, tokens: None})

    with mock.patch.object(cache_kinds, "absolute_positions", keeping_drafts):
        problems, _ = cache_kinds.check_cache_kinds(SCENARIOS["markov8"], config)
    assert len(problems) == len(kinds)
