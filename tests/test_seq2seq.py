"""Encoder-decoder targets (markov8-seq2seq): the real loop's encoder-decoder code, with the decoder-only laws."""

import pytest
import torch

from lossless_check.core.errors import UsageError
from lossless_check.faces.api import cases_for, resolve_scenario, run_cases
from lossless_check.laws.scenarios import SCENARIOS
from lossless_check.laws.seq2seq_stubs import fixed_logits_seq2seq
from lossless_check.laws.stubs import fixed_logits_lm


def test_the_decoder_emits_the_decoder_only_stubs_logits_and_crops_its_cache():
    scenario = SCENARIOS["markov8"]
    seq2seq = fixed_logits_seq2seq(scenario.target, scenario.prompt)
    plain = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
    ids = torch.tensor([list(scenario.prompt) + [2, 5, 6]])
    with torch.no_grad():
        full = seq2seq(input_ids=ids[:, :3], decoder_input_ids=ids, use_cache=True)
        assert torch.equal(full.logits, plain(ids, use_cache=False).logits)
        cache = full.past_key_values if hasattr(full, "past_key_values") else full.cache
        cache.crop(-2)  # drop two tokens, as the loop does after a rejection: the history is read back from it
        again = seq2seq(input_ids=ids[:, :3], decoder_input_ids=torch.tensor([[1]]), cache=cache, use_cache=True,
                        encoder_outputs=None)
        assert torch.equal(again.logits[0, -1], plain(torch.cat([ids[:, :4], torch.tensor([[1]])], 1),
                                                        use_cache=False).logits[0, -1])


def test_only_the_assisted_family_and_its_modes():
    cases = cases_for(["AssistedCandidateGenerator", "PromptLookupCandidateGenerator"], warpers="top_k=3",
                      mode="generate", scenario="markov8-seq2seq")
    result = run_cases(cases, 200, 1e-6, 0)
    assert [c.verdict for c in result.cases[:2]][1] == "skipped"
    assert result.cases[0].verdict in ("lossless", "inconclusive"), result.cases[0].reason
    with pytest.raises(UsageError, match="generate and options"):
        resolve_scenario("markov8-seq2seq", "step")


def test_a_drafter_returning_the_wrong_q_fails_on_the_encoder_decoder_loop():
    # Negative control: greedy drafts verified against softmax(q) (a real bug class) is caught here too.
    cases = cases_for(["lossless_check.mutants.assisted_greedy_draft:AssistedGreedyDraft"], warpers="top_k=3",
                      mode="generate", scenario="markov8-seq2seq")
    result = run_cases(cases, 400, 1e-6, 0)
    assert result.cases[0].verdict == "not_lossless", result.cases[0].reason
