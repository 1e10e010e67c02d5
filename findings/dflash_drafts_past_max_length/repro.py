#!/usr/bin/env python
"""DFlashTokenCandidateGenerator drafts a whole block past `max_length`, and `generate()` can raise.

Standalone reproduction: imports only torch and transformers; nothing is downloaded. Two tiny seeded
models built inline, nothing overridden: a `LlamaForCausalLM` target and transformers' own DFlash
drafter, `MuseGlimmerAssistantModel` (both vocabulary 8, hidden size 16; the drafter's block is 7
positions: the anchor and 6 drafts).

What runs: the real `target.generate(prompt, assistant_model=drafter, speculation_type="dflash",
do_sample=True, top_k=0, max_new_tokens=3, no_repeat_ngram_size=1)`, which builds the real
DFlashTokenCandidateGenerator. Round 1 is the target's alone (the generator skips it); in round 2 the
sequence has 3 tokens and `max_length` 5 leaves room for 1 draft (the verifier adds a token).

The bug (transformers 5.24.0, generation/candidate_generator.py): `get_candidates` computes
`max_new_tokens = min(block_size, max_length - len - 1)` (line 1587) but uses it only to skip a round
(line 1588); the block always drafts `block_size - 1` tokens (line 1648 projects every position of
`last_hidden_state[:, 1:]`). Past `max_length` the drafts still go through the logits processors:
under `no_repeat_ngram_size=1` every token of a vocabulary of 8 is banned once 8 have been used, the
drafter's law is NaN, and `torch.multinomial` raises. (The harness's fixed-logits models hit the same
wall in the verifier: the target, scored past `max_length`, gets an all-banned row.)

    python repro.py                 # exits 1: 6 drafts where max_length leaves room for 1; generate() raises
    python repro.py --no-ban        # without no_repeat_ngram_size: no error, the drafts still overshoot (exit 1)
    python repro.py --block-size 2  # control: one draft per block never overshoots (exit 0)

Exit code: 1 when a round drafts more tokens than `max_length` leaves room for (or `generate()` raises
while drafting such a round): the bug reproduces; 0 when no round does; 2 on bad usage. The check is
exact: the wrapped `get_candidates` only records what the real one returns.
"""

import argparse
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 8
PROMPT = [[1, 2]]


def tiny_models(block_size):
    """A Llama target and a DFlash drafter (MuseGlimmerAssistantModel) reading the target's layer 0."""
    from transformers.models.muse_glimmer_assistant import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.5, tie_word_embeddings=False,
        pad_token_id=None, bos_token_id=None, eos_token_id=None)).eval()
    drafter = MuseGlimmerAssistantModel(MuseGlimmerAssistantConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=64, initializer_range=0.5,
        block_size=block_size, mask_token_id=0, target_layer_ids=[0],
        bos_token_id=None, eos_token_id=None, pad_token_id=None)).eval()
    return target, drafter


def watch_rounds(generator_cls, rounds):
    """Record, for each real `get_candidates` call: input length, room left by max_length, drafts (or the error)."""
    real_get_candidates = generator_cls.get_candidates

    def get_candidates(self, input_ids, *args, **kwargs):
        length = input_ids.shape[1]
        record = {"length": length, "room": self.main_model_max_length - length - 1, "block": self.block_size - 1}
        rounds.append(record)
        try:
            candidate_ids, candidate_logits = real_get_candidates(self, input_ids, *args, **kwargs)
        except RuntimeError as error:
            record["error"] = str(error).splitlines()[0]
            raise
        record["drafts"] = candidate_ids.shape[1] - length
        return candidate_ids, candidate_logits

    generator_cls.get_candidates = get_candidates


def drafted(record):
    """Drafts of a round: what it returned, or the whole block where it raised while drafting it."""
    return record["drafts"] if "drafts" in record else record["block"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=5, help="generate() calls (default 5)")
    parser.add_argument("--block-size", type=int, default=7, help="the drafter's block: anchor + drafts (default 7)")
    parser.add_argument("--max-new-tokens", type=int, default=3)
    parser.add_argument("--no-ban", action="store_true", help="without no_repeat_ngram_size=1")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.block_size < 2 or args.max_new_tokens < 1:
        parser.error("--samples >= 1, --block-size >= 2 and --max-new-tokens >= 1")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    started = time.time()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    candidate_generator = transformers.generation.candidate_generator
    if not hasattr(candidate_generator, "DFlashTokenCandidateGenerator"):
        print("this release has no DFlashTokenCandidateGenerator (it appeared in 5.15.0): nothing to reproduce (exit 0)")
        return 0
    target, drafter = tiny_models(args.block_size)
    rounds = []
    watch_rounds(candidate_generator.DFlashTokenCandidateGenerator, rounds)
    prompt = torch.tensor(PROMPT)
    config = dict(assistant_model=drafter, speculation_type="dflash", do_sample=True, top_k=0,
                  max_new_tokens=args.max_new_tokens, no_repeat_ngram_size=None if args.no_ban else 1)
    print(f"generate(prompt {PROMPT}, {', '.join(f'{k}={v}' for k, v in config.items() if k != 'assistant_model')}); "
          f"vocabulary {VOCAB}, max_length {len(PROMPT[0]) + args.max_new_tokens}")

    raised = overshoot = 0
    for call in range(args.samples):
        start = len(rounds)
        try:
            output = target.generate(prompt, **config)[0].tolist()
        except RuntimeError as error:
            if "error" not in rounds[-1] or rounds[-1]["room"] >= rounds[-1]["block"]:
                raise  # not raised while drafting past max_length: not this finding
            output = f"raised {type(error).__name__}: {rounds[-1]['error']}"
            raised += 1
        past = [r for r in rounds[start:] if drafted(r) > max(r["room"], 0)]
        overshoot += len(past)
        if call < 3 or past:
            detail = "; ".join(f"len {r['length']}: room for {max(r['room'], 0)}, "
                               + (f"drafted {r['drafts']}" if "drafts" in r else f"drafting {r['block']}: {r['error']}")
                               for r in rounds[start:])
            print(f"call {call + 1}: {output}  [{detail}]")
    bad = overshoot > 0
    print(f"\n{len(rounds)} rounds in {args.samples} calls; {overshoot} drafted past max_length; "
          f"generate() raised in {raised} calls")
    verdict = "the bug reproduces (drafts past max_length)" if bad else "no round drafts past max_length"
    print(f"verdict: {verdict} (exit {int(bad)}); {time.time() - started:.1f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
