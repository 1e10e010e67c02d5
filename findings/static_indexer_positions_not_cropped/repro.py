"""StaticIndexedLayer.crop leaves the indexer's positions of rejected drafts (transformers 5.24.0-5.25.0).

A tiny seeded Qwen4-exp (every layer ``indexed_attention``; an indexer that picks 2 blocks of 2 tokens, so that
it selects) decodes greedily with prompt lookup on a static cache, and without it. Speculative greedy decoding
must return plain greedy decoding's tokens. Exit 1 when a call differs (the bug), 0 otherwise.

    python repro.py                  # exit 1 on 5.24.0 and 5.25.0
    python repro.py --dynamic-cache  # control: the default cache, whose crop cuts the positions; exit 0
    python repro.py --fix            # StaticIndexedLayer.crop cuts them too (fix.patch, applied here); exit 0
"""

import argparse
import sys

import torch
import transformers
from transformers import cache_utils

PROMPTS = 4
NEW_TOKENS = 12
DRAFT = 3


def model():
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForCausalLM

    config = Qwen4ExpTextConfig(
        vocab_size=96, hidden_size=64, num_hidden_layers=4, layer_types=["indexed_attention"] * 4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, hc_count=2, hc_lowrank=8,
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=4, indexer_compress_ratio=2,
        rope_parameters={"rope_type": "default", "rope_theta": 100.0, "mrope_section": [4, 2, 2],
                         "mrope_interleaved": True},
        max_position_embeddings=256, initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return Qwen4ExpForCausalLM(config).eval()


def prompts():
    """Prompts that repeat a motif, so that prompt lookup drafts, and is often wrong."""
    g = torch.Generator().manual_seed(1234)
    for _ in range(PROMPTS):
        motif = torch.randint(3, 96, (int(torch.randint(3, 6, (1,), generator=g)),), generator=g)
        filler = torch.randint(3, 96, (int(torch.randint(2, 5, (1,), generator=g)),), generator=g)
        yield torch.cat([motif, filler, motif, motif[:2], filler, motif, motif[:3]])[None]


def decode(lm, ids, static: bool, lookup: bool):
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    if static:
        # Room for drafts up to max_length: a static cache sized max_length - 1 overflows under prompt lookup,
        # another finding (static_cache_drafts_past_max_length) that this one must not be confused with.
        kwargs.update(cache_implementation="static", max_cache_len=ids.shape[1] + NEW_TOKENS + DRAFT + 1)
    if lookup:
        kwargs.update(prompt_lookup_num_tokens=DRAFT)
    with torch.no_grad():
        return lm.generate(ids, **kwargs)[0, ids.shape[1]:]


def fix():
    crop = cache_utils.StaticIndexedLayer.crop

    def crop_positions_too(self, tokens_to_remove):
        crop(self, tokens_to_remove)
        if tokens_to_remove != 0 and self.indexer_position_ids is not None:
            self.indexer_position_ids = self.indexer_position_ids[..., : -abs(tokens_to_remove)]

    cache_utils.StaticIndexedLayer.crop = crop_positions_too


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dynamic-cache", action="store_true", help="control: the default (dynamic) cache")
    parser.add_argument("--fix", action="store_true", help="StaticIndexedLayer.crop cuts the positions too")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    layer = getattr(cache_utils, "StaticIndexedLayer", None)
    if layer is None or "indexer_position_ids" not in layer.__init__.__code__.co_names:
        print(f"transformers {transformers.__version__}: no static indexed layer that keeps positions; nothing to "
              f"reproduce")
        return 0
    if args.fix:
        fix()
    lm = model()
    static = not args.dynamic_cache
    differ = 0
    for i, ids in enumerate(prompts()):
        plain = decode(lm, ids, static, lookup=False)
        try:
            fast = decode(lm, ids, static, lookup=True)
        except ValueError as refused:  # releases that refuse a static cache for speculative decoding
            print(f"transformers {transformers.__version__}: {refused}; nothing to reproduce")
            return 0
        if not torch.equal(plain, fast):
            differ += 1
            at = int((plain != fast).nonzero()[0])
            with torch.no_grad():
                logits = lm(torch.cat([ids[0], plain[:at]])[None], use_cache=False).logits[0, -1]
            print(f"prompt {i}: differs at new token {at}: plain {int(plain[at])}, speculative {int(fast[at])}; an "
                  f"uncached forward prefers plain's by {float(logits[plain[at]] - logits[fast[at]]):.3f} logits")
    cache = "dynamic" if args.dynamic_cache else "static"
    print(f"verdict: {'NOT LOSSLESS' if differ else 'consistent with lossless'}: transformers "
          f"{transformers.__version__}, {cache} cache{' with the fix' if args.fix else ''}: prompt lookup differs from "
          f"plain greedy decoding in {differ} of {PROMPTS} calls")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
