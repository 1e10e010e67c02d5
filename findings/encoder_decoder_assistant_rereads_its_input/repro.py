"""An encoder-decoder assistant re-reads the whole decoder sequence every drafting round (transformers 5.25.0 fails).

A tiny seeded Bart target and its assistant (the same weights plus noise), greedy decoding of 40 new tokens with
the assistant drafting, against plain greedy decoding. Each round ``AssistedCandidateGenerator`` hands the
assistant's ``generate()`` the whole decoder sequence beside its cache; without a decoder attention mask of the ids'
length, ``_prefill`` does not cut the ids to what the cache lacks, so the assistant reads tokens it already holds
again, at new positions. 5.25.0 rolls its cache back by lengths and the cache grows until Bart's position table
ends: ``generate()`` raises. Exit 1 when a call raises or differs from plain greedy decoding, or when the
assistant's cache ever holds more tokens than the sequence; 0 otherwise.

    python repro.py                 # exit 1 on 5.25.0 (4 of 4 calls raise); 5.24.0: the cache outgrows the sequence
    python repro.py --decoder-mask  # control: generate(..., decoder_attention_mask=ones): the ids are cut; exit 0
"""

import argparse
import sys

import torch
import transformers
from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig

PROMPTS = 4
NEW_TOKENS = 40


def pair():
    config = BartConfig(vocab_size=256, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
                        init_std=0.5, bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                        forced_bos_token_id=None, forced_eos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    target = BartForConditionalGeneration(config).eval()
    assistant = BartForConditionalGeneration(config).eval()
    assistant.load_state_dict(target.state_dict())
    with torch.no_grad():
        for weight in assistant.parameters():
            weight.add_(0.02 * torch.randn_like(weight))
    return target, assistant


def greedy() -> GenerationConfig:
    return GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decoder-mask", action="store_true",
                        help="control: pass a decoder attention mask, which the assistant's generate() slices by")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    target, assistant = pair()
    held = []  # (tokens the assistant's cache holds before a forward, tokens it is given)
    forward = assistant.model.decoder.forward

    def watched(*a, **kw):
        cache = kw.get("cache", kw.get("past_key_values"))
        ids = kw.get("input_ids", a[0] if a else None)
        before = cache.get_seq_length() if cache is not None else 0
        held.append((int(before), ids.shape[1] if ids is not None else 0))
        return forward(*a, **kw)

    assistant.model.decoder.forward = watched
    failed = 0
    for i in range(PROMPTS):
        torch.manual_seed(i)
        prompt = torch.randint(3, 256, (1, 8))
        extra = {"decoder_attention_mask": torch.ones((1, 1), dtype=torch.long)} if args.decoder_mask else {}
        held.clear()
        with torch.no_grad():
            plain = target.generate(prompt, generation_config=greedy(), **extra)
            try:
                fast = target.generate(prompt, generation_config=greedy(), assistant_model=assistant, **extra)
                outcome = "identical" if torch.equal(plain, fast) else "DIFFERENT tokens"
            except Exception as exc:  # noqa: BLE001 - the failure is what the script reports
                fast, outcome = None, f"RAISED {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        longest = plain.shape[1] if fast is None else fast.shape[1]
        most = max(before + given for before, given in held)
        grew = most > longest
        failed += outcome != "identical" or grew
        print(f"prompt {i}: {outcome}; the assistant's cache reached {most} tokens for a decoder sequence of at most "
              f"{longest}{' (re-read tokens)' if grew else ''}")
    print(f"verdict: {'BUG (a call raises, differs or re-reads)' if failed else 'consistent with lossless'}: "
          f"transformers {transformers.__version__}{', decoder mask passed' if args.decoder_mask else ''}: {failed} of "
          f"{PROMPTS} calls fail")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
