"""Assisted generation with an assistant model (`AssistedCandidateGenerator`) is lossless.

Written by `lossless-check export-tests`; imports only torch, transformers, pytest, numpy and scipy (through the
shared helper `_speculative_laws.py`, which states the statistics and the false-failure rate of all law tests).
- `do_sample=True` under three warper stacks (top-k, top-p with temperature, a processor pair): the
  laws of generated tokens 1 and 2 against plain sampling's exact laws; each test states the TV it detects.
- `do_sample=False`: greedy assisted decoding equals plain greedy decoding on every prompt (exact).
"""

import pytest
import torch

try:
    from ._speculative_laws import check_greedy, check_sampling, tiny_llama
except ImportError:  # the directory is not a package
    from _speculative_laws import check_greedy, check_sampling, tiny_llama

candidate_generator = pytest.importorskip("transformers.generation.candidate_generator")
if not hasattr(candidate_generator, "AssistedCandidateGenerator"):
    pytest.skip("this transformers has no AssistedCandidateGenerator", allow_module_level=True)

VOCAB = 8
PROMPT = torch.tensor([[1, 2, 3]])
STACKS = {
    "top_k": {"top_k": 3},
    "top_p_temperature": {"top_k": 0, "top_p": 0.8, "temperature": 0.7},
    "repetition_penalty_top_k": {"top_k": 4, "repetition_penalty": 1.5},
}


def models():
    # A nearly flat assistant and a moderately peaked target: a q that is not the law the drafts were drawn from
    # (e.g. raw logits returned after drafting from top-k-processed ones) then moves p/q by up to VOCAB / k, and
    # every stack below keeps two or more target tokens (no stack is a point mass: each can reveal a wrong q).
    target, assistant = tiny_llama(VOCAB, seed=1, head_scale=1.5), tiny_llama(VOCAB, seed=2, head_scale=0.1)
    # Two drafts per round, always: the first round verifies drafts for generated tokens 1 and 2.
    assistant.generation_config.num_assistant_tokens = 2
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    return target, assistant


@pytest.mark.parametrize("stack", list(STACKS))
def test_assisted_sampling_follows_target_law(stack):
    target, assistant = models()
    check_sampling(target, PROMPT, STACKS[stack], 2, {"assistant_model": assistant}, "AssistedCandidateGenerator")


def test_assisted_greedy_equals_plain_greedy():
    target, assistant = models()
    prompts = [torch.tensor([[a, b, c]]) for a, b, c in ((1, 2, 3), (4, 0, 6), (7, 7, 1), (2, 5, 0))]
    check_greedy(target, prompts, {"assistant_model": assistant}, "AssistedCandidateGenerator")
