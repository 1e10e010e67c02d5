"""The designs of the exact sampler check (:mod:`.sampler_exact`): known target and draft laws, and the
law Algorithm 1 emits on them.

Every law is uniform on 1, 2 or 4 of 8 tokens (logits 0 and ``-inf``: every softmax, ratio and residual
is exact in float32, bfloat16 and float16), so every probability, every ratio ``p/q`` a draft can have
(0, 1/2, 1, 2) and every cumulative sum of a residual or bonus law, in any token order, is a multiple
of 1/4: Algorithm 1's decisions, and an inverse-CDF draw's token, are constant on each cell of a uniform
(:data:`~.sampler_draws.CELLS`). Together they cover ratio 1/2 with ties, drafts of target probability 0
at position 1 and 2, a point-mass ``q`` (an argmax drafter), a point-mass target, ``p = q`` (the all-zero
residual must never be formed), ``p > q``, disjoint supports, two fractional ratios in one round, one
draft, every acceptance prefix and the bonus row; for the transformers protocol also ``candidate_logits``
in bfloat16 and float16, and ``is_done_candidate`` for a sampler that takes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from lossless_check.subjects.sampler import DONE_PARAMETERS, Sampler
from lossless_check.subjects.verifier import uniform

#: Laws per position, ``(p, q)``, and what each covers. Residuals and bonus laws have supports of 1, 2 or 4.
HALF = (uniform(0, 1, 2, 3), uniform(0, 1))  # ratio 1/2 (ties); residual 1/2 on {2, 3}
ZERO = (uniform(0, 1), uniform(1, 2))  # draft 2 has p = 0, draft 1 ratio 1; residual a point mass on 0
GREEDY = (uniform(0, 1), uniform(0))  # a point-mass q (an argmax drafter): ratio 1/2; residual a point mass
POINT = (uniform(3), uniform(2, 3))  # a point-mass p: draft 3 ratio 2, draft 2 p = 0
EQUAL = (uniform(6, 7), uniform(6, 7))  # p = q: always accepted; the all-zero residual is never formed
WIDER = (uniform(0, 1), uniform(0, 1, 2, 3))  # p > q on 0, 1 (ratio 2); 2, 3 have p = 0; residual on {0, 1}
DISJOINT = (uniform(4, 5), uniform(0, 1))  # every draft has p = 0: always rejected, the residual is p itself


@dataclass(frozen=True)
class Design:
    """Target rows ``p`` (``k + 1``), draft rows ``q`` (``k``), and ``candidate_logits``' dtype."""

    name: str
    p: tuple[np.ndarray, ...]
    q: tuple[np.ndarray, ...]
    draft_dtype: torch.dtype = torch.float32
    #: ``is_done_candidate`` (releases up to 5.17: the candidate hit a stop): a full accept emits no bonus.
    is_done: bool = False

    @property
    def k(self) -> int:
        return len(self.q)


def _design(name: str, positions: list[tuple[np.ndarray, np.ndarray]], bonus: np.ndarray,
            draft_dtype: torch.dtype = torch.float32, is_done: bool = False) -> Design:
    return Design(name, tuple(p for p, _ in positions) + (bonus,), tuple(q for _, q in positions), draft_dtype,
                  is_done)


BONUS_PAIR, BONUS_POINT, BONUS_FOUR = uniform(5, 6), uniform(7), uniform(0, 1, 2, 3)
DESIGNS = (
    _design("ratio 1/2, then a draft of p = 0 at position 2", [HALF, ZERO], BONUS_PAIR),
    _design("ratio 1/2 at both positions (two acceptances by chance)", [HALF, HALF], BONUS_POINT),
    _design("a draft of p = 0 at position 1, then ratio 1/2", [ZERO, HALF], BONUS_POINT),
    _design("point-mass q (an argmax drafter), then point-mass p", [GREEDY, POINT], BONUS_FOUR),
    _design("p = q at both positions (never rejects)", [EQUAL, EQUAL], BONUS_PAIR),
    _design("p > q on q's support, then a point-mass q", [WIDER, GREEDY], BONUS_POINT),
    _design("disjoint supports (always rejects), then p = q", [DISJOINT, EQUAL], BONUS_PAIR),
    _design("one draft, ratio 1/2", [HALF], BONUS_FOUR),
)
#: The first design again with ``candidate_logits`` in half precision (the transformers protocol only).
HALF_PRECISION = tuple(_design(f"{DESIGNS[0].name} ({str(dtype).removeprefix('torch.')} q)",
                               [HALF, ZERO], BONUS_PAIR, dtype) for dtype in (torch.bfloat16, torch.float16))
#: For a transformers-protocol sampler that takes ``is_done_candidate``: the first design with it set.
IS_DONE = (_design(f"{DESIGNS[0].name} (is_done_candidate: no bonus token)", [HALF, ZERO], BONUS_PAIR,
                   is_done=True),)


def fractions(law: np.ndarray) -> list[Fraction]:
    return [Fraction(float(v)) for v in law]


def algorithm_1(design: Design, drafts: tuple[int, ...]) -> dict[tuple[int, ...], Fraction]:
    """The law Algorithm 1 emits for these drafts, exactly."""
    law: dict[tuple[int, ...], Fraction] = {}
    reach = Fraction(1)
    for i, d in enumerate(drafts):
        p, q = fractions(design.p[i]), fractions(design.q[i])
        accept = min(Fraction(1), p[d] / q[d])
        if accept < 1:
            mass = [max(a - b, Fraction(0)) for a, b in zip(p, q)]
            total = sum(mass)
            for x, m in enumerate(mass):
                if m:
                    law[drafts[:i] + (x,)] = reach * (1 - accept) * m / total
        reach *= accept
        if not reach:
            return law
    if design.is_done:  # a full accept ends the round: no bonus token
        law[drafts] = reach
        return law
    for x, m in enumerate(fractions(design.p[-1])):
        if m:
            law[drafts + (x,)] = reach * m
    return law


def law_text(row: np.ndarray) -> str:
    support = np.flatnonzero(row > 0).tolist()
    return f"1/{len(support)} on {set(support)}" if len(support) > 1 else f"point mass {support[0]}"


def design_text(design: Design) -> str:
    """The design's laws, position by position."""
    parts = [f"p{i + 1} {law_text(p)}, q{i + 1} {law_text(q)}" for i, (p, q) in enumerate(zip(design.p, design.q))]
    return "; ".join(parts + [f"bonus p{design.k + 1} {law_text(design.p[-1])}"])


def designs_for(sampler: Sampler) -> tuple[Design, ...]:
    """The designs a sampler of this protocol gets (half-precision ``candidate_logits`` need logits; the
    ``is_done_candidate`` design, a sampler that takes it)."""
    done = IS_DONE if sampler.parameters & set(DONE_PARAMETERS) else ()
    return DESIGNS + (HALF_PRECISION + done if sampler.protocol == "transformers" else ())
