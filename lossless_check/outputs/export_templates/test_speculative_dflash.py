"""Block drafting with a DFlash drafter (`DFlashTokenCandidateGenerator`).

Written by `lossless-check export-tests`; imports only torch, transformers, pytest, numpy and scipy (through the
shared helper `_speculative_laws.py`, which states the statistics and the false-failure rate of all law tests).
A tiny seeded `LlamaForCausalLM` target and transformers' own DFlash drafter (`MuseGlimmerAssistantModel`, block
of 7: the anchor and 6 drafts, reading the target's layer 0); `generate(..., speculation_type="dflash")` builds
the real generator. Round 1 is the target's alone, round 2 drafts.
- exact: no round drafts more tokens than `max_length` leaves room for. Past it the drafts still go through the
  logits processors (a processor that bans a whole row makes `generate()` raise) and cost a full block.
- `do_sample=True`: the laws of generated tokens 1 and 2 against plain sampling's exact laws.
- `do_sample=False`: greedy equals plain greedy decoding (exact).
"""

import pytest
import torch

try:
    from ._speculative_laws import BuiltGenerators, check_greedy, check_sampling, tiny_llama, where
except ImportError:  # the directory is not a package
    from _speculative_laws import BuiltGenerators, check_greedy, check_sampling, tiny_llama, where

candidate_generator = pytest.importorskip("transformers.generation.candidate_generator")
if not hasattr(candidate_generator, "DFlashTokenCandidateGenerator"):
    pytest.skip("this transformers has no DFlashTokenCandidateGenerator", allow_module_level=True)

VOCAB = 8
PROMPT = torch.tensor([[1, 2]])


def models():
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    target = tiny_llama(VOCAB, seed=0, layers=2)
    drafter = MuseGlimmerAssistantModel(MuseGlimmerAssistantConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=64, initializer_range=0.5,
        block_size=7, mask_token_id=0, target_layer_ids=[0], bos_token_id=None, eos_token_id=None,
        pad_token_id=None)).eval()
    return target, {"assistant_model": drafter, "speculation_type": "dflash"}


def test_dflash_drafts_within_max_length():
    target, speculative = models()
    built = BuiltGenerators(target)
    rounds = []
    real_generator = target._get_candidate_generator

    def watched_generator(*args, **kwargs):
        generator = real_generator(*args, **kwargs)
        real_get_candidates = generator.get_candidates

        def get_candidates(input_ids, *more, **named):
            candidate_ids, candidate_logits = real_get_candidates(input_ids, *more, **named)
            room = max(generator.main_model_max_length - input_ids.shape[1] - 1, 0)
            rounds.append((input_ids.shape[1], room, candidate_ids.shape[1] - input_ids.shape[1]))
            return candidate_ids, candidate_logits

        generator.get_candidates = get_candidates
        return generator

    target._get_candidate_generator = watched_generator
    torch.manual_seed(0)
    for max_new_tokens in (2, 3, 4, 5):
        target.generate(PROMPT, do_sample=True, top_k=0, max_new_tokens=max_new_tokens, **speculative)
    past = [(length, room, drafts) for length, room, drafts in rounds if drafts > room]
    assert rounds, f"no drafting round ran (generators built: {built.names()})"
    assert not past, (
        "DFlashTokenCandidateGenerator drafts past max_length: "
        + "; ".join(f"sequence of {length}: room for {room}, drafted {drafts}" for length, room, drafts in past)
        + f" (get_candidates: {where(candidate_generator.DFlashTokenCandidateGenerator.get_candidates)})")


def test_dflash_sampling_follows_target_law():
    target, speculative = models()
    check_sampling(target, PROMPT, {"top_k": 0}, 2, speculative, "DFlashTokenCandidateGenerator")


def test_dflash_greedy_equals_plain_greedy():
    target, speculative = models()
    prompts = [PROMPT, torch.tensor([[5, 6, 7]]), torch.tensor([[0, 3]])]
    check_greedy(target, prompts, speculative, "DFlashTokenCandidateGenerator")
