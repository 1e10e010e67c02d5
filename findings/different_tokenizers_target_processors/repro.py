#!/usr/bin/env python
"""AssistedCandidateGeneratorDifferentTokenizers hands the target's logits processors to the assistant.

Standalone reproduction: imports only torch and transformers (and tokenizers, a dependency of
transformers); nothing is downloaded. Two tiny seeded `LlamaForCausalLM` models with different
vocabularies built inline: the target's tokenizer has 43 words, the assistant's 23 (its first 23).

What runs: the real `target.generate(prompt, assistant_model=assistant, tokenizer=..., assistant_tokenizer=...,
do_sample=False, max_new_tokens=8, <processor>)`, which builds the real
AssistedCandidateGeneratorDifferentTokenizers, against plain greedy `target.generate(prompt, do_sample=False,
max_new_tokens=8, <processor>)`, for `bad_words_ids` and `sequence_bias` on a token both vocabularies
have (id 5) and on one only the target has (id 30).

The bug (transformers 5.24.0, generation/candidate_generator.py): the generator keeps the target's
`LogitsProcessorList` (line 166, `self.logits_processor = logits_processor`) and passes it to the
assistant's `generate()` (line 320, `"logits_processor": self.logits_processor`). Those processors hold
target-vocabulary ids, and `SequenceBiasLogitsProcessor` (which `NoBadWordsLogitsProcessor` subclasses)
sizes its bias from the first scores it sees (logits_process.py line 1322, `_prepare_bias_variables`):
- an id only the target has: the assistant's first call raises ValueError (line 1354);
- an id both have: the bias is sized for the assistant (23) on the first drafting round, and the same
  processor object then fails on the target's scores (43): RuntimeError at line 1329
  (`bias += self.length_1_bias`).
Plain greedy decoding with the same processor runs. (With equal vocabulary sizes nothing raises, but
the assistant's drafts are banned or biased at ids that name other tokens in its vocabulary.)

    python repro.py                   # exits 1: speculative generate() raises where plain greedy does not
    python repro.py --no-processors   # control: no processor, speculative equals plain greedy (exit 0)

Exit code: 1 when speculative decoding raises or differs from plain greedy decoding (the bug
reproduces), 0 when every output is identical, 2 on bad usage. The check is exact (greedy, no statistics).
"""

import argparse
import sys

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = [f"w{i}" for i in range(40)]
SPECIAL = ["<unk>", "</s>", "<pad>"]


def tokenizer(words):
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIAL + words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>", pad_token="<pad>")


def model(vocab, seed):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=1, pad_token_id=2,
                         bos_token_id=None)
    return LlamaForCausalLM(config).eval()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-processors", action="store_true", help="control: no logits processor")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    from transformers.generation import candidate_generator

    if not hasattr(candidate_generator, "AssistedCandidateGeneratorDifferentTokenizers"):
        print(f"transformers {transformers.__version__} has no AssistedCandidateGeneratorDifferentTokenizers "
              f"(4.46.0+): nothing to reproduce")
        return 0
    target_tokenizer, assistant_tokenizer = tokenizer(WORDS), tokenizer(WORDS[:20])
    target, assistant = model(len(target_tokenizer), 0), model(len(assistant_tokenizer), 1)
    prompt = target_tokenizer("w1 w2 w3 w4", return_tensors="pt").input_ids
    cases = {"none": {}} if args.no_processors else {
        "bad_words_ids=[[5]]": {"bad_words_ids": [[5]]}, "bad_words_ids=[[30]]": {"bad_words_ids": [[30]]},
        "sequence_bias={(5,): -5.0}": {"sequence_bias": {(5,): -5.0}},
        "sequence_bias={(30,): -5.0}": {"sequence_bias": {(30,): -5.0}}}
    print(f"transformers {transformers.__version__}: target vocabulary {len(target_tokenizer)}, assistant "
          f"vocabulary {len(assistant_tokenizer)}, prompt {prompt.tolist()[0]}, greedy, max_new_tokens=8")
    failures = 0
    for name, processor in cases.items():
        plain = target.generate(prompt, do_sample=False, max_new_tokens=8, **processor)
        try:
            speculative = target.generate(prompt, do_sample=False, max_new_tokens=8, assistant_model=assistant,
                                          tokenizer=target_tokenizer, assistant_tokenizer=assistant_tokenizer,
                                          **processor)
            outcome = "identical" if torch.equal(plain, speculative) else (
                f"DIFFERS: {speculative.tolist()[0]} vs plain {plain.tolist()[0]}")
        except Exception as exc:  # noqa: BLE001 - the bug: the speculative loop raises
            where = exc.__traceback__
            while where.tb_next is not None:
                where = where.tb_next
            outcome = (f"RAISES {type(exc).__name__}: {str(exc).splitlines()[0]} "
                       f"({where.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]} line {where.tb_lineno}); "
                       f"plain greedy gives {plain.tolist()[0]}")
        failures += outcome != "identical"
        print(f"  {name}: {outcome}")
    print(f"verdict: {'NOT LOSSLESS (exact)' if failures else 'lossless'}: {failures} of {len(cases)} processors "
          f"break speculative decoding with two tokenizers")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
