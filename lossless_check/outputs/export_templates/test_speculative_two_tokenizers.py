"""Assisted generation with an assistant of another tokenizer is lossless.

Written by `lossless-check export-tests`; imports only torch, transformers, pytest, numpy and scipy (through the
shared helper `_speculative_laws.py`, which states the statistics and the false-failure rate of all law tests).
- `do_sample=True` (`UniversalSpeculativeDecodingGenerator`): the law of generated token 1 against plain
  sampling's exact law. Detects, e.g., a q returned over a permuted vocabulary.
- `do_sample=False` (`AssistedCandidateGeneratorDifferentTokenizers`): greedy equals plain greedy decoding, with
  no processor and under `bad_words_ids` / `sequence_bias` on ids both vocabularies have and only the target has
  (exact). Detects the target's processors reaching the assistant (they hold target-vocabulary ids).
The tokenizers are word-level fast tokenizers written as tokenizer.json files (no download).
"""

import json
import os
import tempfile

import pytest
import torch
import transformers

try:
    from ._speculative_laws import check_greedy, check_sampling, tiny_llama
except ImportError:  # the directory is not a package
    from _speculative_laws import check_greedy, check_sampling, tiny_llama

candidate_generator = pytest.importorskip("transformers.generation.candidate_generator")

# Different, overlapping vocabularies: 22 shared words at different ids; sizes differ, as generate() requires.
TARGET_WORDS = ["<unk>", "the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "rug", "red", "blue", "old",
                "big", "small", "new", "sun", "moon", "tree", "house", "car", "road", "bird"]
ASSISTANT_WORDS = ["<unk>", "a", "the", "bird", "road", "car", "house", "tree", "moon", "sun", "new", "small", "big",
                   "old", "blue", "red", "rug", "mat", "under", "on", "ran", "sat", "ship", "sea", "boat"]
GREEDY_WORDS = [f"w{i}" for i in range(40)]
SPECIAL = ["<unk>", "</s>", "<pad>"]


def word_level_tokenizer(words, **special):
    """A fast word-level tokenizer over `words` (ids in list order), built from a tokenizer.json file."""
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)}, "unk_token": "<unk>"}}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tokenizer.json")
        with open(path, "w") as file:
            json.dump(spec, file)
        return transformers.PreTrainedTokenizerFast(tokenizer_file=path, unk_token="<unk>", **special)


@pytest.mark.skipif(not hasattr(candidate_generator, "UniversalSpeculativeDecodingGenerator"),
                    reason="this transformers has no UniversalSpeculativeDecodingGenerator")
def test_universal_sampling_follows_target_law():
    target_tokenizer, assistant_tokenizer = word_level_tokenizer(TARGET_WORDS), word_level_tokenizer(ASSISTANT_WORDS)
    target = tiny_llama(len(TARGET_WORDS), seed=49, layers=2)
    assistant = tiny_llama(len(ASSISTANT_WORDS), seed=50, layers=2)
    prompt = target_tokenizer("the cat sat on the", return_tensors="pt").input_ids
    speculative = {"assistant_model": assistant, "tokenizer": target_tokenizer,
                   "assistant_tokenizer": assistant_tokenizer}
    check_sampling(target, prompt, {"top_k": 0}, 1, speculative, "UniversalSpeculativeDecodingGenerator")


GREEDY_PROCESSORS = {
    "none": {},
    "bad_words_shared_id": {"bad_words_ids": [[5]]},
    "bad_words_target_only_id": {"bad_words_ids": [[30]]},
    "sequence_bias_shared_id": {"sequence_bias": {(5,): -5.0}},
    "sequence_bias_target_only_id": {"sequence_bias": {(30,): -5.0}},
}


@pytest.mark.skipif(not hasattr(candidate_generator, "AssistedCandidateGeneratorDifferentTokenizers"),
                    reason="this transformers has no AssistedCandidateGeneratorDifferentTokenizers")
@pytest.mark.parametrize("processors", list(GREEDY_PROCESSORS))
def test_different_tokenizers_greedy_equals_plain_greedy(processors):
    special = {"eos_token": "</s>", "pad_token": "<pad>"}
    target_tokenizer = word_level_tokenizer(SPECIAL + GREEDY_WORDS, **special)
    assistant_tokenizer = word_level_tokenizer(SPECIAL + GREEDY_WORDS[:20], **special)
    target = tiny_llama(len(target_tokenizer), seed=0, eos_token_id=1, pad_token_id=2, num_key_value_heads=1)
    assistant = tiny_llama(len(assistant_tokenizer), seed=1, eos_token_id=1, pad_token_id=2, num_key_value_heads=1)
    prompts = [target_tokenizer(text, return_tensors="pt").input_ids for text in ("w1 w2 w3 w4", "w9 w30 w2")]
    speculative = {"assistant_model": assistant, "tokenizer": target_tokenizer,
                   "assistant_tokenizer": assistant_tokenizer}
    check_greedy(target, prompts, speculative, "AssistedCandidateGeneratorDifferentTokenizers",
                 **GREEDY_PROCESSORS[processors])


def test_tokenizer_files_round_trip():
    """The hand-written tokenizer.json files give the ids the tests rely on (a guard for the tests above)."""
    tokenizer = word_level_tokenizer(TARGET_WORDS)
    assert tokenizer("the cat", return_tensors="pt").input_ids.tolist() == [[1, 3]]
    assert torch.equal(tokenizer("sun", return_tensors="pt").input_ids, torch.tensor([[TARGET_WORDS.index("sun")]]))
