"""Pearson chi-square and G statistics, reported beside the verdict (asymptotic: not valid at small alpha)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import chdtrc

from lossless_check.stats.strata import Stratum

#: Cells with an expected count below this are pooled before the chi-square / G diagnostics.
MIN_EXPECTED_COUNT = 5.0


def _pooled_cells(counts: np.ndarray, expected_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool the cells whose expected count is below MIN_EXPECTED_COUNT into one cell.

    Rule: cells with expected count < 5 are merged (with each other) into one pooled cell; if that
    pooled cell is still below 5 it is merged with the smallest remaining cell. Zero-expected cells
    are dropped (they are the support check's business) and the rest rescaled to the kept count.
    """
    keep = expected_counts > 0
    counts, expected_counts = counts[keep], expected_counts[keep]
    if counts.sum() > 0:
        expected_counts = expected_counts * (counts.sum() / expected_counts.sum())
    small = expected_counts < MIN_EXPECTED_COUNT
    if small.any():
        pooled_c, pooled_e = counts[small].sum(), expected_counts[small].sum()
        counts, expected_counts = counts[~small], expected_counts[~small]
        if pooled_e < MIN_EXPECTED_COUNT and len(expected_counts) > 0:
            j = int(np.argmin(expected_counts))
            pooled_c, pooled_e = pooled_c + counts[j], pooled_e + expected_counts[j]
            counts, expected_counts = np.delete(counts, j), np.delete(expected_counts, j)
        counts = np.append(counts, pooled_c)
        expected_counts = np.append(expected_counts, pooled_e)
    return counts, expected_counts


def _chi2_diagnostics(strata: Sequence[Stratum]) -> tuple[float | None, int, float | None, float | None, float | None]:
    chi2 = g = 0.0
    dof = 0
    for s in strata:
        c, e = _pooled_cells(s.counts.astype(np.float64), s.n * s.expected)
        if len(c) < 2 or c.sum() == 0:  # nothing inside the support: the support check speaks
            continue
        chi2 += float(((c - e) ** 2 / e).sum())  # Pearson
        seen = c > 0
        g += float(2.0 * (c[seen] * np.log(c[seen] / e[seen])).sum())  # G (log-likelihood ratio)
        dof += len(c) - 1
    if dof == 0:
        return None, 0, None, None, None
    return chi2, dof, float(chdtrc(dof, chi2)), g, float(chdtrc(dof, g))

