"""Named fixed-logits scenarios: a target table, a drafter table and a prompt.

The default scenario is small enough to enumerate exactly (vocabulary 8) and chosen so that the
drafter and target disagree (acceptance rate well below 1) and every common warper bites: no
single token dominates, and mass is spread over more tokens than ``top_k=3`` keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .errors import UsageError
from .tables import FixedLogits


@dataclass(frozen=True)
class Scenario:
    """What the stubs emit. ``gamma`` is the number of tokens drafted per round."""

    name: str
    target: FixedLogits
    drafter: FixedLogits
    prompt: tuple[int, ...]
    gamma: int = 3
    #: The tokenizers of the generators that translate between two vocabularies (Universal,
    #: DifferentTokenizers; others ignore it): ``stub`` (word-level, ``get_vocab()`` in alphabetical
    #: order, deterministic), ``fast`` (plain ``tokenizers``-library fast tokenizers, nothing
    #: overridden: ``get_vocab()`` in the library's hash-map order) or ``id-ordered`` (the same fast
    #: tokenizers with ``get_vocab()`` in id order: the control). See :mod:`.adapters.vocabularies`.
    tokenizers: str = "stub"
    #: What the scenario is for, shown by ``lossless-check list``.
    description: str = ""

    def __post_init__(self) -> None:
        if self.target.vocab_size != self.drafter.vocab_size:
            raise UsageError(
                f"scenario {self.name!r}: target vocabulary {self.target.vocab_size} != drafter vocabulary "
                f"{self.drafter.vocab_size}"
            )
        if not self.prompt:
            raise UsageError(f"scenario {self.name!r}: the prompt must hold at least one token")
        if any(not 0 <= t < self.vocab_size for t in self.prompt):
            raise UsageError(f"scenario {self.name!r}: prompt tokens must lie in [0, {self.vocab_size})")
        if self.tokenizers not in ("stub", "fast", "id-ordered"):
            raise UsageError(f"scenario {self.name!r}: tokenizers must be stub, fast or id-ordered")
        if self.gamma < 1:
            raise UsageError(f"scenario {self.name!r}: gamma must be >= 1")

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size


def _seeded(seed: int, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return np.round(np.random.default_rng(seed).normal(scale=scale, size=shape), 3)


VOCAB = 8

_BASE = _seeded(20261202, (VOCAB,), 1.4)

#: Markov target (depends on the previous token) and a position-dependent drafter that roughly
#: agrees with it: acceptance rates near 0.6, so long accepted runs and rejections both occur.
DEFAULT = Scenario(
    name="markov8",
    target=FixedLogits.markov(_BASE + _seeded(1, (VOCAB, VOCAB), 0.6)),
    drafter=FixedLogits.per_position(_BASE + _seeded(2, (4, VOCAB), 0.6)),
    prompt=(3, 1, 4),
    gamma=3,
)

#: The same target and drafter at every position: the simplest case.
IID = Scenario(
    name="iid8",
    target=FixedLogits.iid(_BASE),
    drafter=FixedLogits.iid(_BASE + _seeded(3, (VOCAB,), 0.8)),
    prompt=(3, 1, 4),
    gamma=3,
)

#: Vocabulary of the real-tokenizer scenarios: 32 shared words, so that a random order of the
#: shared words hides the Universal bug (first-token TV below 0.1) with probability under 1e-4
#: (Monte Carlo over 200,000 uniform orders with these tables; median TV 0.23).
VOCAB_TOKENIZERS = 32
_BASE32 = _seeded(20261202, (VOCAB_TOKENIZERS,), 1.4)
_IID32_TARGET = FixedLogits.iid(_BASE32)
_IID32_DRAFTER = FixedLogits.iid(_BASE32 + _seeded(3, (VOCAB_TOKENIZERS,), 0.8))

#: Universal and DifferentTokenizers with real ``tokenizers``-library fast tokenizers (WordLevel,
#: 32 shared words under different ids plus 2 assistant-only words), nothing overridden.
FAST_TOKENIZERS = Scenario(
    name="iid32-fast-tokenizers",
    target=_IID32_TARGET,
    drafter=_IID32_DRAFTER,
    prompt=(3, 1, 4),
    gamma=3,
    tokenizers="fast",
    description="real fast tokenizers (hash-ordered get_vocab) for the generators with two vocabularies",
)

#: The control of :data:`FAST_TOKENIZERS`: the same tokenizers with ``get_vocab()`` in id order.
ID_ORDERED_VOCAB = replace(
    FAST_TOKENIZERS,
    name="iid32-id-ordered-vocab",
    tokenizers="id-ordered",
    description="control of iid32-fast-tokenizers: the same tokenizers, get_vocab() in id order",
)

#: Vocabulary of the large scenario: the size of Llama 2's.
VOCAB_LARGE = 32_000


def zipf_logits(seed: int, vocab: int, exponent: float = 1.5, noise: float = 0.3) -> np.ndarray:
    """Peaked logits with a long tail: ``p(rank r) ~ r^-exponent`` over a seeded random assignment of
    ranks to tokens, with seeded Gaussian noise on the logits (rounded to 3 decimals, as the others)."""
    rng = np.random.default_rng(seed)
    ranks = rng.permutation(vocab) + 1
    return np.round(-exponent * np.log(ranks) + rng.normal(scale=noise, size=vocab), 3)


_ZIPF = zipf_logits(20261203, VOCAB_LARGE)

#: A realistic large-vocabulary pair: Zipf(1.5) target (top token near 0.35, 10% of the mass beyond
#: its ~60 most likely tokens, spread over the other 31,900), drafter the same table with noise
#: (acceptance near 0.8). Laws are tested on the coarsened partition of :func:`~lossless_check.analysis.coarsening`.
LARGE_VOCAB = Scenario(
    name="zipf32k",
    target=FixedLogits.iid(_ZIPF),
    drafter=FixedLogits.iid(_ZIPF + _seeded(4, (VOCAB_LARGE,), 0.5)),
    prompt=(3, 1, 4),
    gamma=3,
    description="vocabulary 32,000, Zipf-like peaked laws with long tails (laws tested on 64 top cells + 16 tail buckets)",
)

SCENARIOS = {s.name: s for s in (DEFAULT, IID, FAST_TOKENIZERS, ID_ORDERED_VOCAB, LARGE_VOCAB)}
