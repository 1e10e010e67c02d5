"""Prompt lookup decoding (`PromptLookupCandidateGenerator`) and early exit (`EarlyExitCandidateGenerator`).

Written by `lossless-check export-tests`; imports only torch, transformers, pytest, numpy and scipy (through the
shared helper `_speculative_laws.py`, which states the statistics and the false-failure rate of all law tests).
Both draft without a second model: prompt lookup copies the tokens after an n-gram match (its drafts are
verified by token match, no q); early exit drafts with the target's own first layer.
- `do_sample=True` (`top_k=4`): the laws of generated tokens 1 and 2 against plain sampling's exact laws.
- `do_sample=False`: greedy equals plain greedy decoding (exact).
"""

import pytest
import torch

try:
    from ._speculative_laws import check_greedy, check_sampling, tiny_llama
except ImportError:  # the directory is not a package
    from _speculative_laws import check_greedy, check_sampling, tiny_llama

candidate_generator = pytest.importorskip("transformers.generation.candidate_generator")
has_prompt_lookup = hasattr(candidate_generator, "PromptLookupCandidateGenerator")
has_early_exit = hasattr(candidate_generator, "EarlyExitCandidateGenerator")

VOCAB = 8
# Repeated n-grams: the lookup finds a match for every suffix the target is likely to produce.
PROMPT = torch.tensor([[1, 2, 3, 1, 2, 3, 4, 1, 2]])
PROMPTS = [PROMPT, torch.tensor([[5, 6, 5, 6, 5]]), torch.tensor([[0, 1, 0, 1, 7, 0]])]


@pytest.mark.skipif(not has_prompt_lookup, reason="this transformers has no PromptLookupCandidateGenerator")
def test_prompt_lookup_sampling_follows_target_law():
    target = tiny_llama(VOCAB, seed=3)
    check_sampling(target, PROMPT, {"top_k": 4}, 2, {"prompt_lookup_num_tokens": 2},
                   "PromptLookupCandidateGenerator")


@pytest.mark.skipif(not has_prompt_lookup, reason="this transformers has no PromptLookupCandidateGenerator")
def test_prompt_lookup_greedy_equals_plain_greedy():
    check_greedy(tiny_llama(VOCAB, seed=3), PROMPTS, {"prompt_lookup_num_tokens": 2}, "PromptLookupCandidateGenerator")


@pytest.mark.skipif(not has_early_exit, reason="this transformers has no EarlyExitCandidateGenerator")
def test_early_exit_sampling_follows_target_law():
    check_sampling(tiny_llama(VOCAB, seed=4, layers=2), PROMPT, {"top_k": 4}, 2, {"assistant_early_exit": 1},
                   "EarlyExitCandidateGenerator")


@pytest.mark.skipif(not has_early_exit, reason="this transformers has no EarlyExitCandidateGenerator")
def test_early_exit_greedy_equals_plain_greedy():
    check_greedy(tiny_llama(VOCAB, seed=4, layers=2), PROMPTS, {"assistant_early_exit": 1},
                 "EarlyExitCandidateGenerator")
