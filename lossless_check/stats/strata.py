"""Stratified samples, the acceptance law's container, and the multiple-testing corrections."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Stratum:
    """Counts observed in one group and the exact law they should follow."""

    counts: np.ndarray  # int, shape (V,)
    expected: np.ndarray  # float64 probabilities, shape (V,)
    #: For counts of cells of a coarsened vocabulary: the most TV a true token law can have beyond its
    #: TV on these cells (``lossless_check.evidence.analysis.within_cell_tv``); ``None`` for counts of tokens.
    within_cell_tv: float | None = None

    @property
    def n(self) -> int:
        return int(self.counts.sum())




@dataclass
class AcceptanceLaw:
    """Exact law of ``n_matches`` over ``0..gamma`` for a round with known drafter and target."""

    probabilities: np.ndarray
    gamma: int = field(init=False)

    def __post_init__(self) -> None:
        self.gamma = len(self.probabilities) - 1

    @property
    def mean_acceptance_rate(self) -> float:
        """Expected accepted drafts per drafted token: ``E[n_matches] / gamma``."""
        return float(np.dot(np.arange(self.gamma + 1), self.probabilities) / max(self.gamma, 1))



def holm_correction(pvalues: Sequence[float]) -> np.ndarray:
    """Holm step-down adjusted p-values: reject ``i`` at family rate ``a`` iff ``adjusted[i] <= a``.

    Controls the family-wise error rate under any dependence between the tests.
    """
    p = np.asarray(pvalues, dtype=np.float64)
    n = len(p)
    if n == 0:
        return p
    order = np.argsort(p)
    adjusted = np.empty(n)
    running = 0.0
    for rank, idx in enumerate(order):
        running = max(running, min(1.0, (n - rank) * p[idx]))
        adjusted[idx] = running
    return adjusted



def bonferroni_min(pvalues: Sequence[float]) -> float:
    """Valid combined p-value of several tests of one hypothesis: ``min(1, k * min p)``."""
    pvalues = [p for p in pvalues if p is not None]
    if not pvalues:
        return 1.0
    return float(min(1.0, len(pvalues) * min(pvalues)))

