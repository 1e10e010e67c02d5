"""Named fixed-logits scenarios: a target table, a drafter table and a prompt.

The default scenario is small enough to enumerate exactly (vocabulary 8) and chosen so that the
drafter and target disagree (acceptance rate well below 1) and every common warper bites: no
single token dominates, and mass is spread over more tokens than ``top_k=3`` keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

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

SCENARIOS = {s.name: s for s in (DEFAULT, IID)}
