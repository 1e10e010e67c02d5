"""Assisted decoding returns an encoder-decoder's cross-attentions split along the heads (transformers 5.25.0).

With `output_attentions=True, return_dict_in_generate=True`, `generate()` returns one tuple of
cross-attentions per generated token, each layer's tensor `(batch, heads, 1, encoder length)`.
`_assisted_decoding` verifies several tokens in one forward and splits its cross-attentions per
token with `_split_model_outputs`, which in 5.25.0 narrows dimension 1 when it has no `input_shape`:
for an attention tensor that is the heads, not the queries. Each token then gets one head of
several queries (or, with fewer heads than tokens to split, `narrow` raises).

The check is exact: with `do_sample=False` and a tiny seeded `BartForConditionalGeneration` (eager
attention, 4 heads, float64) as its own assistant (3 drafts a round), assisted decoding must return
plain greedy decoding's tokens and, per generated token and layer, cross-attentions of plain
decoding's shape. Beside the verdict the script counts the tokens whose cross-attentions differ in
value from plain decoding's by more than float64 rounding (1e-9; the rounding of a row computed in a
batch of several instead of alone is about 1e-15): an older defect, in 5.24.0 too, gives the first
round's later tokens the row of the token before (README.md).

    python repro.py                  # exit 1 where the bug is (5.25.0)
    python repro.py --no-attentions  # control: the same calls without output_attentions; exit 0

Exit 1 when any call returns tokens or cross-attentions that differ from plain decoding's, 0 otherwise.
"""

import argparse
import sys

import torch
import transformers
from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig

VOCAB = 32
PROMPTS = 5
PROMPT_LENGTH = 6
NEW_TOKENS = 8
HEADS = 4
#: Float64 rounding of a batched against a one-token forward is about 1e-16; float32 resolves about 1e-7.
ROUNDING = 1e-9


def bart():
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        pad_token_id=1, bos_token_id=0, eos_token_id=VOCAB - 1, decoder_start_token_id=2, forced_eos_token_id=None,
        init_std=1.0, attn_implementation="eager")
    model = BartForConditionalGeneration(config).double().eval()
    # A constant draft length, no confidence stop: every round drafts num_assistant_tokens
    model.generation_config.num_assistant_tokens = 3
    model.generation_config.num_assistant_tokens_schedule = "constant"
    model.generation_config.assistant_confidence_threshold = 0.0
    return model


def compare(model, prompt, attentions: bool) -> tuple[str | None, int]:
    """What differs between assisted and plain greedy decoding of ``prompt`` (None: nothing), and how many
    generated tokens' cross-attentions (of the same shape) differ in value beyond float64 rounding."""
    config = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, eos_token_id=None,
                              forced_eos_token_id=None, decoder_start_token_id=2, pad_token_id=1,
                              output_attentions=attentions, return_dict_in_generate=True)
    with torch.no_grad():
        plain = model.generate(prompt, generation_config=config)
        try:
            assisted = model.generate(prompt, generation_config=config, assistant_model=model)
        except RuntimeError as exc:  # fewer heads than tokens to split: narrow() runs out of heads
            return f"assisted generate() raises {type(exc).__name__}: {exc}", 0
    if not torch.equal(plain.sequences, assisted.sequences):
        return f"tokens differ: plain {plain.sequences.tolist()}, assisted {assisted.sequences.tolist()}", 0
    if not attentions:
        return None, 0
    if len(plain.cross_attentions) != len(assisted.cross_attentions):
        return f"{len(assisted.cross_attentions)} tokens' cross-attentions, plain decoding {len(plain.cross_attentions)}", 0
    other_values = 0
    for token, (p_layers, a_layers) in enumerate(zip(plain.cross_attentions, assisted.cross_attentions)):
        for layer, (p, a) in enumerate(zip(p_layers, a_layers)):
            if p.shape != a.shape:
                return (f"token {token}, layer {layer}: cross-attentions of shape {tuple(a.shape)}, plain decoding "
                        f"{tuple(p.shape)} (batch, heads, queries, encoder length)"), 0
        other_values += any(float((p - a).abs().max()) > ROUNDING for p, a in zip(p_layers, a_layers))
    return None, other_values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-attentions", action="store_true",
                        help="control: the same calls without output_attentions (tokens only)")
    args = parser.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}"
          + (" (control: no output_attentions)" if args.no_attentions else ""))
    model = bart()
    g = torch.Generator().manual_seed(1)
    differ = 0
    for i in range(PROMPTS):
        prompt = torch.randint(3, VOCAB - 1, (1, PROMPT_LENGTH), generator=g)
        what, other_values = compare(model, prompt, attentions=not args.no_attentions)
        same = "same tokens" + ("" if args.no_attentions else " and cross-attentions' shapes")
        print(f"prompt {i}: {what or same}"
              + (f"; {other_values} of {NEW_TOKENS} tokens' cross-attentions differ in value" if other_values else ""))
        differ += what is not None
    lossless = differ == 0
    print(f"verdict: {'consistent with plain decoding' if lossless else 'NOT THE SAME AS PLAIN DECODING'}: "
          f"{differ} of {PROMPTS} assisted calls differ from plain greedy decoding (exact)")
    return 0 if lossless else 1


if __name__ == "__main__":
    sys.exit(main())
