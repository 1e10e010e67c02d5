#!/usr/bin/env python
"""How large the Universal bug is for each order `get_vocab()` may return (companion of repro.py).

A fast tokenizer's `get_vocab()` comes out in a different hash-map order in every process (and
every call), so the size of the bug changes from run to run. This script takes the models and
tokenizers of repro.py and, for N uniformly random orders of the overlapping vocabulary, computes
the exact law of the first generated token from the closed form of one-draft speculative sampling
(Leviathan et al., Algorithm 1), with the draft drawn from the drafter's q and verified against
the q the generator returns (q permuted as in transformers 5.0-5.24):

    out(x) = q(x) min(1, p(x) / q'(x)) + (1 - sum_y q(y) min(1, p(y) / q'(y))) [p - q']+(x) / |[p - q']+|

It prints quantiles of TV(out, p). The real generator and verifier are exercised by repro.py; this
is the arithmetic that explains its numbers (with the id order, q' = q and TV is 0).

    python order_sensitivity.py [--orders 1000]
"""

import argparse
import os
import random
import sys

import torch
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repro  # noqa: E402  (the models and tokenizers of the reproduction)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    target_tok = repro.word_level_tokenizer(repro.TARGET_WORDS, PreTrainedTokenizerFast)
    assistant_tok = repro.word_level_tokenizer(repro.ASSISTANT_WORDS, PreTrainedTokenizerFast)
    target = repro.tiny_llama(len(target_tok), seed=49)
    drafter = repro.tiny_llama(len(assistant_tok), seed=50)
    text = "the cat sat on the"
    with torch.no_grad():
        p = target(target_tok(text, return_tensors="pt").input_ids).logits[0, -1].double().softmax(-1)
        drafter_logits = drafter(assistant_tok(text, return_tensors="pt").input_ids).logits[0, -1].double()
    words_t, words_a = repro.TARGET_WORDS, repro.ASSISTANT_WORDS
    to_target = {a: words_t.index(w) for a, w in enumerate(words_a) if w in words_t}
    id_order = sorted(to_target)

    def tv_for(order):
        """`order`: the assistant ids of the pruned LM head rows, in get_vocab() order."""
        pruned = drafter_logits[order].softmax(-1)
        q = torch.zeros_like(p)  # what the drafts follow: row j drafts assistant id order[j]
        q_returned = torch.zeros_like(p)  # get_target_logits: row j lands on the j-th smallest id
        for j, (a, a_sorted) in enumerate(zip(order, id_order)):
            q[to_target[a]] = pruned[j]
            q_returned[to_target[a_sorted]] = pruned[j]
        accept = torch.where(q > 0, (p / q_returned.clamp_min(1e-300)).clamp(max=1.0), torch.zeros_like(p))
        residual = (p - q_returned).clamp_min(0)
        out = q * accept + (1 - (q * accept).sum()) * residual / residual.sum()
        return 0.5 * float((out - p).abs().sum())

    rng = random.Random(args.seed)
    tvs = []
    for _ in range(args.orders):
        order = list(id_order)
        rng.shuffle(order)
        tvs.append(tv_for(order))
    tvs.sort()
    print(f"first-token TV from the target law, exact, over {args.orders} random get_vocab() orders "
          f"({len(id_order)} overlapping words):")
    for quantile in (0.0, 0.01, 0.1, 0.5, 0.9):
        print(f"  {'min' if quantile == 0 else f'{quantile:.0%} quantile':>12}: {tvs[int(quantile * (len(tvs) - 1))]:.3f}")
    print(f"  {'max':>12}: {tvs[-1]:.3f}")
    print(f"id order (the control): {tv_for(id_order):.2e}")


if __name__ == "__main__":
    main()
