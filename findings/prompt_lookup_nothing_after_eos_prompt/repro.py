#!/usr/bin/env python
"""Prompt lookup emits no token at all after a prompt that ends in EOS (transformers 4.40 - 5.17).

Standalone reproduction: imports only torch and transformers; nothing is downloaded. One tiny seeded
`LlamaForCausalLM` built inline (vocabulary 16, EOS id 1).

What runs: the real `model.generate(prompt, prompt_lookup_num_tokens=3, max_new_tokens=6)` (greedy, and
`do_sample=True` under a fixed seed), which builds the real PromptLookupCandidateGenerator, against plain
decoding `model.generate(prompt, max_new_tokens=6)`, for the prompt `[3, 4, 5, 1]`: it ends in EOS and
has no repeated n-gram, so the first round drafts nothing.

The bug (transformers 5.17.0, generation/utils.py `_assisted_decoding`): every round checks the
stopping criteria on the candidate sequence (line 3857, `is_done_candidate = stopping_criteria(
candidate_input_ids, None)`). A round without drafts hands it the prompt itself, whose last token is
EOS, so it is "done"; with `n_matches == candidate_length == 0` the loop then keeps `n_matches - 1 = -1`
accepted tokens (lines 3938-3940): `selected_tokens[:, :0]`, no token, and the stopping criteria on the
unchanged sequence end the loop. Plain decoding checks stopping only after each new token, so it emits
`max_new_tokens` tokens. 4.40.0 brought both `is_done_candidate` (line 4659) and `EosTokenCriteria`;
5.18.0 removed `is_done_candidate`.

    python repro.py                   # exits 1 on 4.40 - 5.17: no token where plain decoding emits 6
    python repro.py --no-final-eos    # control: the prompt without its EOS; tokens are emitted (exit 0)

Exit code: 1 when prompt lookup emits no token where plain decoding emits some (the bug reproduces),
0 otherwise, 2 on bad usage. The check is exact (one call each).
"""

import argparse
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-final-eos", action="store_true", help="control: drop the prompt's final EOS")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=1, pad_token_id=2,
                         bos_token_id=None)
    model = LlamaForCausalLM(config).eval()
    prompt = [3, 4, 5] if args.no_final_eos else [3, 4, 5, 1]
    ids = torch.tensor([prompt])
    print(f"transformers {transformers.__version__}: prompt {prompt} (EOS id 1), max_new_tokens=6")
    failures = 0
    for sample in (False, True):
        outputs = []
        for lookup in ({}, {"prompt_lookup_num_tokens": 3}):
            torch.manual_seed(1)
            with torch.no_grad():
                out = model.generate(ids, do_sample=sample, max_new_tokens=6, **lookup)
            outputs.append(out[0, len(prompt):].tolist())
        plain, lookup = outputs
        broken = len(plain) > 0 and len(lookup) == 0
        failures += broken
        print(f"  {'do_sample=True' if sample else 'greedy'}: plain {plain}, prompt lookup {lookup}"
              f"{'  <- no token' if broken else ''}")
    print(f"verdict: {'NOT LOSSLESS (exact)' if failures else 'lossless'}: prompt lookup emitted nothing in "
          f"{failures} of 2 calls where plain decoding emitted tokens")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
