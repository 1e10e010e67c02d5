#!/usr/bin/env python
"""`_speculative_sampling` accepts a draft whose target probability is 0 when `rand()` returns 0.

Standalone reproduction: imports only torch and transformers; nothing is downloaded, no model.

The verifier accepts draft x when `r <= p(x) / q(x)` with `r = torch.rand_like(...)` (transformers
5.24.0 `generation/utils.py` lines 4478-4479). float32 `rand()` takes values k / 2^24, k = 0 ..
2^24 - 1, so it returns exactly 0 with probability 2^-24; then a draft with p(x) = 0 passes
`0 <= 0 / q(x)` and is emitted, although the target can never produce it. The algorithm
(Leviathan et al.) accepts with probability min(1, p/q), which is 0 there: `r < p / q` does that.

What runs: the installed `_speculative_sampling`, called once, exactly as `_assisted_decoding`
calls it, on a target whose support is {0, 1, 2} (vocabulary 8), a uniform drafter q = 1/8, and
the draft token 7 (p = 0). Randomness is placed, not mocked: the script finds the first exact 0 in
the seeded float32 stream of `torch.rand`, advances the generator to just before it, and lets the
verifier draw it. The same call is made with a draw just after (a control the verifier must reject).

    python repro.py              # exits 1: token 7 (target probability 0) is emitted
    python repro.py --seed S     # another stream (the zero is searched for in that stream)

Exit code: 1 when the verifier emits a token of target probability 0 (the bug reproduces), 0 when
it does not, 2 when no exact 0 was found in the first --search draws of the stream (nothing tested).
The check is exact: one call, no statistics (the zero draw is placed, not waited for).
"""

import argparse
import inspect
import sys

import torch
import transformers
from transformers.generation.utils import _speculative_sampling

VOCAB = 8
SUPPORT = (0, 1, 2)  # the target's support: p = 1/3 each
DRAFT = 7  # outside the support: p(DRAFT) = 0, q(DRAFT) = 1/8


def first_zero(seed, search):
    """Index of the first exact 0.0 in the float32 stream of `torch.rand` after `manual_seed(seed)`."""
    torch.manual_seed(seed)
    zeros = (torch.rand(search) == 0).nonzero()
    return int(zeros[0, 0]) if len(zeros) else None


def verify_once(seed, skip):
    """One call of the installed verifier after `skip` float32 draws of the seeded stream.

    Returns (emitted tokens, n_matches, the draw the verifier gets)."""
    target_logits = torch.full((1, 2, VOCAB), -float("inf"))  # positions: the draft, and the bonus
    target_logits[..., list(SUPPORT)] = 0.0
    drafter_logits = torch.zeros(1, 1, VOCAB)  # q uniform over the vocabulary
    candidate_input_ids = torch.tensor([[1, 2, DRAFT]])  # prompt [1, 2], one draft
    args = [candidate_input_ids, drafter_logits, 1, target_logits]
    # The required arguments after `new_logits` drift between releases: `is_done_candidate` (up to 5.17),
    # `last_assistant_token_is_eos` and `max_matches` (the first releases, e.g. 4.37.0).
    extra = {"is_done_candidate": False, "last_assistant_token_is_eos": False, "max_matches": 1}
    for name, parameter in list(inspect.signature(_speculative_sampling).parameters.items())[4:]:
        if parameter.default is inspect.Parameter.empty:
            args.append(extra[name])
    torch.manual_seed(seed)
    torch.rand(skip)
    state = torch.get_rng_state()
    draw = float(torch.rand_like(torch.zeros(1))[0])  # what the verifier's `rand_like` will get
    torch.set_rng_state(state)
    emitted, n_matches = _speculative_sampling(*args)
    return emitted[0].tolist(), int(n_matches), draw


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--search", type=int, default=1 << 24,
                        help="draws to search for an exact 0 (default 2^24: found with probability 0.63)")
    args = parser.parse_args(argv)
    if args.search < 1:
        parser.error("--search must be >= 1")
    print(f"transformers {transformers.__version__} ({transformers.__file__}), torch {torch.__version__}")
    print(f"target p: 1/3 on tokens {list(SUPPORT)}, 0 elsewhere; drafter q: 1/{VOCAB} uniform; draft token {DRAFT}")
    zero_at = first_zero(args.seed, args.search)
    if zero_at is None:
        print(f"no exact 0 in the first {args.search} draws of seed {args.seed}: nothing tested (exit 2)")
        return 2
    print(f"seed {args.seed}: float32 torch.rand returns exactly 0 at draw {zero_at}")

    bad = False
    for label, skip in (("control, the draw after the zero", zero_at + 1), ("the zero draw", zero_at)):
        emitted, n_matches, draw = verify_once(args.seed, skip)
        outside = [t for t in emitted if t not in SUPPORT]
        print(f"{label}: r = {draw!r}, emitted {emitted}, n_matches {n_matches}"
              + (f"; token(s) {outside} have target probability 0" if outside else "; all in the target's support"))
        bad |= bool(outside)
    verdict = ("NOT LOSSLESS: the bug reproduces (a draft with p = 0 is accepted when rand() returns 0)" if bad
               else "consistent with lossless (the p = 0 draft is rejected even at r = 0)")
    print(f"verdict: {verdict} (exit {int(bad)})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
