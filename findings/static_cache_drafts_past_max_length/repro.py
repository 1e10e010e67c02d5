"""Speculative decoding on a static cache writes drafts past its end: `generate()` raises IndexError.

`generate()` sizes a static cache (`cache_implementation="static"`) for `max_length - 1` tokens: plain
decoding never feeds the last one. `_assisted_decoding` feeds the target every candidate the generator
returns, and prompt lookup drafts up to `max_length` tokens (MTP and DFlash draft past it): the
verification forward then writes position `max_length - 1` of a cache that has no such position.

A tiny seeded Llama built from a config (no download), greedy decoding, prompt lookup drafting 3 tokens,
on prompts where the lookup finds matches near the end of the generation.

    python repro.py                  # exit 1 where generate() raises (5.24.0, 5.25.0; 5.11-5.23 refuse a static cache)
    python repro.py --dynamic-cache  # control: the same calls with the default dynamic cache; exit 0

Exit 1 when a speculative call raises or differs from plain greedy decoding with the same cache, 0 otherwise.
"""

import argparse
import sys

import torch
import transformers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

VOCAB = 16
PROMPTS = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dynamic-cache", action="store_true", help="control: the default (dynamic) cache")
    args = parser.parse_args()
    cache = None if args.dynamic_cache else "static"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, cache_implementation={cache}")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2)).eval()

    def config(**routing):
        # EOS outside the vocabulary: every call runs to max_length
        return GenerationConfig(do_sample=False, max_new_tokens=6, pad_token_id=0, eos_token_id=VOCAB,
                                cache_implementation=cache, **routing)

    try:
        model.generate(torch.zeros(1, 2, dtype=torch.long), generation_config=config(prompt_lookup_num_tokens=1))
    except ValueError as exc:  # 5.11-5.23: "assisted generate is not supported with Static cache classes"
        print(f"nothing to reproduce: this release refuses speculative decoding on a static cache ({exc})")
        return 0
    raised, differ, first = 0, 0, None
    g = torch.Generator().manual_seed(1)
    for _ in range(PROMPTS):
        prompt = torch.randint(0, 4, (1, 8), generator=g)  # 4 tokens: prompt lookup finds matches
        with torch.no_grad():
            plain = model.generate(prompt, generation_config=config())
            try:
                speculative = model.generate(prompt, generation_config=config(prompt_lookup_num_tokens=3))
            except Exception as exc:  # noqa: BLE001 - what the release raises is the finding
                raised += 1
                first = first or f"prompt {prompt[0].tolist()}: {type(exc).__name__}: {exc}"
                continue
        differ += not torch.equal(plain, speculative)
    print(f"prompt lookup (3 tokens), max_new_tokens=6: generate() raised in {raised} of {PROMPTS} calls, "
          f"{differ} of the others differ from plain greedy decoding" + (f"; first: {first}" if first else ""))
    failed = raised + differ
    print(f"verdict: {'consistent with lossless' if not failed else 'NOT LOSSLESS'}: {raised} raised, {differ} differ "
          f"(exact; plain greedy decoding with the same cache never raised)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
