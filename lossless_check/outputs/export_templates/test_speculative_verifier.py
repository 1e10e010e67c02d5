"""The installed `_speculative_sampling` accepts a draft with probability min(1, p/q): exact checks, no model.

Written by `lossless-check export-tests`; imports only torch, transformers and pytest. False-failure rate: 0
(exact). What it detects: a verifier that accepts a draft of target probability 0 at any float32 `rand()` value,
including the exact 0 that `torch.rand` returns with probability 2^-24 per draft (`r <= p / q` accepts it;
`r < p / q` accepts with probability exactly p / q).
"""

import functools
import inspect

import pytest
import torch

speculative_sampling = pytest.importorskip("transformers.generation.utils")._speculative_sampling

VOCAB = 8
SUPPORT = (0, 1, 2)  # the target's support: p = 1/3 each
DRAFT = 7  # outside the support: p(DRAFT) = 0, q(DRAFT) = 1/8
SEED = 3  # torch.manual_seed(3): the float32 stream of torch.rand returns exactly 0.0 at draw 1,532,311


@functools.cache
def first_zero(seed, search=1 << 24):
    """Index of the first exact 0.0 in the float32 stream of `torch.rand` after `manual_seed(seed)`."""
    torch.manual_seed(seed)
    zeros = (torch.rand(search) == 0).nonzero()
    return int(zeros[0, 0]) if len(zeros) else None


def verify_once(seed, skip):
    """One call of the installed verifier, as `_assisted_decoding` makes it, after `skip` draws of the stream."""
    target_logits = torch.full((1, 2, VOCAB), -float("inf"))  # the draft's position and the bonus position
    target_logits[..., list(SUPPORT)] = 0.0
    drafter_logits = torch.zeros(1, 1, VOCAB)  # q uniform
    args = [torch.tensor([[1, 2, DRAFT]]), drafter_logits, 1, target_logits]
    # Required arguments after `new_logits` drift: `is_done_candidate` (up to 5.17), `last_assistant_token_is_eos`
    # and `max_matches` (the first releases).
    extra = {"is_done_candidate": False, "last_assistant_token_is_eos": False, "max_matches": 1}
    for name, parameter in list(inspect.signature(speculative_sampling).parameters.items())[4:]:
        if parameter.default is inspect.Parameter.empty:
            args.append(extra[name])
    torch.manual_seed(seed)
    torch.rand(skip)
    emitted, n_matches = speculative_sampling(*args)
    return emitted[0].tolist(), int(n_matches)


@pytest.mark.parametrize("offset", [1, 0], ids=["draw_after_zero", "zero_draw"])
def test_verifier_rejects_zero_probability_draft(offset):
    zero_at = first_zero(SEED)
    assert zero_at is not None, "seed 3 has an exact 0 in its first 2^24 float32 draws"
    emitted, n_matches = verify_once(SEED, zero_at + offset)
    outside = [t for t in emitted if t not in SUPPORT]
    assert not outside, (
        f"_speculative_sampling emitted {emitted} (n_matches {n_matches}): token(s) {outside} have target "
        f"probability 0, accepted at rand() == {'0.0' if offset == 0 else 'the draw after 0.0'} "
        f"({inspect.getsourcefile(speculative_sampling)} line {inspect.getsourcelines(speculative_sampling)[1]}: "
        f"accept with `r < p / q`, not `r <= p / q`)")
