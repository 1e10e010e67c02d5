#!/usr/bin/env python
"""AssistedCandidateGeneratorDifferentTokenizers rolls the assistant's cache back in the target's token units.

Standalone reproduction: imports only torch and transformers (and tokenizers, a dependency of
transformers); nothing is downloaded. Tiny seeded `LlamaForCausalLM` models built inline, for two pairs of
tokenizers, also built inline:
- `word`: word-level tokenizers over 43 and 23 words (the assistant's are the target's first 23), the pair of
  the project's exported two-tokenizer test; prompts `w1 w2 w3 w4` and `w9 w30 w2`;
- `bpe`: byte-level BPE tokenizers trained here on one seeded corpus with vocabularies of 400 (target) and 300
  (assistant), so the assistant splits a text into 2-4 times as many tokens, as a smaller-vocabulary
  assistant does; 20 prompts, prefixes of the corpus's lines.

What runs: the real greedy `target.generate(prompt, assistant_model=assistant, tokenizer=..., assistant_tokenizer=...,
do_sample=False, max_new_tokens=N)` (the real AssistedCandidateGeneratorDifferentTokenizers, no logits
processor) against plain greedy `target.generate(prompt, do_sample=False, max_new_tokens=N)`. A wrapper around
the generator's `_update_past_and_masks` (it only reads) counts the drafting rounds in which the assistant's
cache, after the rollback, is as long as its input or longer: nothing new to prefill.

The bug (transformers 5.25.0, generation/candidate_generator.py): 5.25.0 rolls the assistant's cache back by
`tokens_to_remove = self._last_ids_length - input_ids.shape[-1] + num_extra_tokens_to_remove` (line 303), where
`input_ids` are the assistant's ids and the cache holds assistant tokens, but this generator sets
`self._last_ids_length` from the TARGET's ids (lines 550-552: `input_ids.shape[-1]` or
`new_target_ids.shape[-1]`). Whenever the assistant's sequence is longer than the target's candidate sequence
(the assistant splits the text into more tokens, or drafts a special token that decodes to nothing) the cache
is cropped too little or not at all: it then covers positions that no longer hold the assistant's input. `_prefill`
(generation/utils.py lines 4321-4334) slices `input_ids[:, -(input_len - past_length):]`: a difference of 0
feeds the whole input again after the cache, a negative one a wrong suffix, and once the cache is twice the
input an empty tensor, on which the model raises (Llama: `RuntimeError: cannot reshape tensor of 0 elements`).
5.24.0 cropped to an absolute length computed from the cache itself (`target_cache_size = input_len - 1 -
remove_from_pkv - num_added_tokens`), so every round prefilled at least 2 tokens.

    python repro.py                          # exits 1 on 5.25.0: greedy generate() raises where plain greedy runs
    python repro.py --assistant-units   # control: the rolled-back length is recorded in the assistant's tokens (exit 0)

Exit code: 1 when a speculative call raises or differs from plain greedy decoding (the bug reproduces), 0 when
every output is identical, 2 on bad usage. The check is exact (greedy, no statistics).
"""

import argparse
import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<unk>", "</s>", "<pad>"]
WORDS = [f"w{i}" for i in range(40)]
CORPUS_WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "rug", "red", "blue", "old", "big", "small",
                "new", "sun", "moon", "tree", "house", "car", "road", "bird", "quickly", "slowly", "happily", "yesterday",
                "tomorrow", "beautiful", "wonderful", "garden", "kitchen", "window"]
MAX_NEW_TOKENS = {"word": 8, "bpe": 12}


def fast(backend):
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>", pad_token="<pad>")


def word_level(words):
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIAL + words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return fast(backend)


def corpus():
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(len(CORPUS_WORDS), (300, 12), generator=generator).tolist()
    return [" ".join(CORPUS_WORDS[i] for i in row) for row in rows]


def byte_level_bpe(lines, vocab_size):
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(lines, trainer)
    return fast(backend)


def model(vocab, seed):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         initializer_range=0.5, tie_word_embeddings=False, eos_token_id=1, pad_token_id=2,
                         bos_token_id=None)
    return LlamaForCausalLM(config).eval()


def pair(name):
    """(target tokenizer, assistant tokenizer, prompts) of a pair."""
    if name == "word":
        return word_level(WORDS), word_level(WORDS[:20]), ["w1 w2 w3 w4", "w9 w30 w2"]
    lines = corpus()
    return byte_level_bpe(lines, 400), byte_level_bpe(lines, 300), [lines[i][: 20 + 3 * i] for i in range(20)]


class RoundCounter:
    """Counts the drafting rounds whose assistant cache, after the rollback, leaves nothing to prefill."""

    def __init__(self):
        self.rounds = self.nothing_to_prefill = 0
        generator = transformers.generation.candidate_generator.AssistedCandidateGenerator
        original = generator._update_past_and_masks

        def counted(instance, input_ids, *args, **kwargs):
            result = original(instance, input_ids, *args, **kwargs)
            cache = instance.assistant_kwargs.get("cache")
            if cache is not None:
                self.rounds += 1
                self.nothing_to_prefill += cache.get_seq_length() >= input_ids.shape[-1]
            return result

        generator._update_past_and_masks = counted


def record_assistant_units():
    """After each drafting round, record the length the next rollback starts from in the assistant's tokens: the
    assistant's last output sequence, whose tokens but the last its cache holds (what 5.25.0's same-tokenizer
    AssistedCandidateGenerator records, line 227). Releases without `_last_ids_length` never read it."""
    generator = transformers.generation.candidate_generator.AssistedCandidateGeneratorDifferentTokenizers
    original = generator.get_candidates

    def recorded(instance, input_ids, **kwargs):
        result = original(instance, input_ids, **kwargs)
        instance._last_ids_length = instance.prev_assistant_ids.shape[-1]
        return result

    generator.get_candidates = recorded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assistant-units", action="store_true",
                        help="control: after each drafting round the generator's _last_ids_length is set to the "
                             "assistant's sequence length (the units of its cache), the cause removed")
    parser.add_argument("--pair", choices=["word", "bpe", "both"], default="both", help="tokenizer pairs to run")
    args = parser.parse_args()
    if not hasattr(transformers.generation.candidate_generator, "AssistedCandidateGeneratorDifferentTokenizers"):
        print(f"transformers {transformers.__version__} has no AssistedCandidateGeneratorDifferentTokenizers: "
              "nothing to reproduce")
        return 0
    counter = RoundCounter()
    if args.assistant_units:
        record_assistant_units()
    print(f"transformers {transformers.__version__}")
    failures = calls = 0
    for name in (["word", "bpe"] if args.pair == "both" else [args.pair]):
        target_tokenizer, assistant_tokenizer, prompts = pair(name)
        target, assistant = model(len(target_tokenizer), 0), model(len(assistant_tokenizer), 1)
        rounds, empty = counter.rounds, counter.nothing_to_prefill
        for text in prompts:
            prompt = target_tokenizer(text, return_tensors="pt").input_ids
            assistant_length = assistant_tokenizer(text, return_tensors="pt").input_ids.shape[1]
            plain = target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW_TOKENS[name])
            calls += 1
            try:
                speculative = target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW_TOKENS[name],
                                              assistant_model=assistant, tokenizer=target_tokenizer,
                                              assistant_tokenizer=assistant_tokenizer)
            except Exception as error:  # noqa: BLE001 - the bug's effect is an exception deep in the assistant's forward
                failures += 1
                print(f"  {name} {text!r} ({prompt.shape[1]} target / {assistant_length} assistant tokens): "
                      f"raises {type(error).__name__}: {str(error).splitlines()[0]}")
                continue
            if not torch.equal(plain, speculative):
                failures += 1
                print(f"  {name} {text!r}: speculative {speculative[0].tolist()} != plain {plain[0].tolist()}")
        print(f"{name}: drafting rounds with nothing to prefill: {counter.nothing_to_prefill - empty} of "
              f"{counter.rounds - rounds}")
    outcome = "the bug reproduces" if failures else "consistent"
    print(f"verdict: {outcome}: speculative greedy raises or differs from plain greedy in {failures} of {calls} calls")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
