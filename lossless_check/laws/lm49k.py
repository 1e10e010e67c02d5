"""The tables of the ``lm49k`` scenario: 49,152 tokens, calibrated to a real checkpoint pair's kept-mass
quantiles under ``top_k=50`` (upstream's report), so that the bug class it found moves TV as it did there.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from lossless_check.core.errors import UsageError
from lossless_check.laws.tables import FixedLogits

#: SmolLM2's vocabulary (the drafter/target pair of transformers issue #47932).
VOCAB_LM = 49_152


#: The ``top_k`` whose kept mass the scenario reproduces: ``generate()``'s default.
LM_TOP_K = 50


#: Quantiles of Z, the raw drafter mass ``top_k=50`` keeps, over 477 real next-token positions of
#: SmolLM2-135M drafting for SmolLM2-360M (transformers issue #47932): ``{quantile level: Z}``. The
#: ends are its worst position (acceptance-ratio inflation 7.7577x, Z = 0.129) and Z -> 1.
UPSTREAM_KEPT_MASS = {0.0: 1 / 7.7577, 0.05: 0.4795, 0.25: 0.7638, 0.5: 0.8815, 0.75: 0.9605, 0.95: 0.9922,
                      1.0: 0.9995}


#: The same positions' total variation between committed tokens and the target when the raw q is
#: returned (the raw-logits bug), for comparison with :func:`raw_logits_tv` (not used to build anything).
UPSTREAM_RAW_LOGITS_TV = {0.05: 0.0024, 0.25: 0.0184, 0.5: 0.0485, 0.75: 0.0979, 0.95: 0.2023}


#: Positions (rows) of the lm49k tables: 2**6 - 1, so that their quantile levels j / 64 are symmetric.
LM_POSITIONS = 63


#: Gaussian noise (in logits) between the drafter's and the target's row: the scenario's one free
#: parameter, set so that the acceptance rate (0.75 at top_k=50) and the raw-logits TV quantiles
#: land near upstream's (0.73; p25 0.018, median 0.049, p75 0.098). Measured, not asserted: see
#: ``tests/test_scenarios.py`` and the README.
LM_NOISE = 0.7


def quantile_levels(n: int) -> np.ndarray:
    """``n = 2**m - 1`` quantile levels ``j / 2**m`` in van der Corput order (0.5, 0.25, 0.75,
    0.125, ...): every first ``k`` positions of a generation spread over the distribution as evenly
    as ``k`` points can, and the first position, where every step-mode trial lands, is the median."""
    m = int(round(np.log2(n + 1)))
    if 2**m - 1 != n:
        raise UsageError(f"quantile_levels needs n = 2**m - 1, got {n}")
    levels = []
    for i in range(1, n + 1):
        bits = format(i, f"0{m}b")[::-1]
        levels.append(int(bits, 2) / 2**m)
    return np.array(levels)


def kept_mass(rows: np.ndarray, k: int) -> np.ndarray:
    """Raw softmax mass (float64) of the ``k`` largest logits of each row: what ``top_k=k`` keeps."""
    rows = np.atleast_2d(np.asarray(rows, dtype=np.float64))
    shifted = np.exp(rows - rows.max(axis=1, keepdims=True))
    top = np.partition(shifted, -k, axis=1)[:, -k:].sum(axis=1)
    return top / shifted.sum(axis=1)


def _zipf_exponents(kept: np.ndarray, vocab: int, k: int) -> np.ndarray:
    """Exponents ``s`` whose Zipf law ``p(rank r) ~ r^-s`` over ``vocab`` tokens keeps ``kept`` in its top ``k``
    (Z is increasing in s: interpolation on a grid, then three secant steps per row)."""
    log_rank = np.log(np.arange(1, vocab + 1))

    def z(s: np.ndarray) -> np.ndarray:
        w = np.exp(-np.outer(s, log_rank))
        return w[:, :k].sum(axis=1) / w.sum(axis=1)

    grid = np.linspace(0.3, 4.0, 48)
    s = np.interp(kept, z(grid), grid)
    step = np.full_like(s, 1e-3)
    for _ in range(3):
        here, there = z(s), z(s + step)
        slope = np.where(there != here, (there - here) / step, 1.0)
        s = s + (kept - here) / slope
    return s


@lru_cache(maxsize=None)
def lm49k_tables(seed: int = 20261226) -> tuple[FixedLogits, FixedLogits]:
    """The lm49k pair: row ``j`` is the ``j``-th generated position. The drafter's row is a Zipf law
    (over a seeded random ranking of the vocabulary) whose exponent makes its kept mass at
    ``top_k=50`` the upstream quantile :func:`quantile_levels` gives the position; the target's row
    is the drafter's plus :data:`LM_NOISE` Gaussian noise (rounded to 3 decimals, as the others)."""
    rng = np.random.default_rng(seed)
    levels = quantile_levels(LM_POSITIONS)
    kept = np.interp(levels, list(UPSTREAM_KEPT_MASS), list(UPSTREAM_KEPT_MASS.values()))
    exponents = _zipf_exponents(kept, VOCAB_LM, LM_TOP_K)
    log_rank = np.log(np.arange(1, VOCAB_LM + 1))
    drafter = np.empty((LM_POSITIONS, VOCAB_LM))
    target = np.empty((LM_POSITIONS, VOCAB_LM))
    for j, s in enumerate(exponents):
        drafter[j, rng.permutation(VOCAB_LM)] = -s * log_rank
        target[j] = drafter[j] + rng.normal(scale=LM_NOISE, size=VOCAB_LM)
    return FixedLogits.per_position(np.round(target, 3)), FixedLogits.per_position(np.round(drafter, 3))


def _quantile_name(level: float) -> str:
    return "median" if level == 0.5 else f"p{round(level * 100):02d}"


def quantile_summary(values: np.ndarray, levels=(0.05, 0.25, 0.5, 0.75, 0.95)) -> str:
    """``p05 0.48, p25 0.76, ...`` of ``values`` (linear interpolation, as numpy's default)."""
    return ", ".join(f"{_quantile_name(q)} {np.quantile(values, q):.2f}" for q in levels)
