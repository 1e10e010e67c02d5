"""From observations to tests: stratification, the per-position law tests and the anytime e-value.

Every mode observes rows of emitted tokens (``-1`` past the end of a row). At output position
``j`` the rows that reached ``j`` are grouped by the exact law of their ``j``-th token given the
tokens before it (a *stratum*), and each position is one law test (:func:`position_tests`).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from scipy.special import logsumexp

from lossless_check.evidence.results import EXACT_CHECKS, POWER, CaseResult
from lossless_check.stats import Stratum, bonferroni_min, mixture_log_evalues, tv_confidence_interval, verdict_test

#: ``law_of(prefix)`` is the exact law of the next token after ``prompt + prefix`` (``None``: no law).
LawOf = Callable[[tuple], "np.ndarray | None"]


def stratify(rows: np.ndarray, position: int, law_of: LawOf) -> tuple[np.ndarray, list[np.ndarray]]:
    """Stratum of every row at ``position``: rows whose tokens before it have the same exact law share
    one; -1 where ``law_of`` has no law."""
    laws: list[np.ndarray] = []
    index: dict[bytes, int] = {}
    of_prefix: dict[tuple, int] = {}
    ids = np.empty(len(rows), dtype=np.int64)
    for r, row in enumerate(rows[:, :position].tolist()):
        prefix = tuple(row)
        if prefix not in of_prefix:
            law = law_of(prefix)
            if law is None:
                of_prefix[prefix] = -1
            else:
                of_prefix[prefix] = index.setdefault(law.tobytes(), len(laws))
                if of_prefix[prefix] == len(laws):
                    laws.append(law)
        ids[r] = of_prefix[prefix]
    return ids, laws


#: Vocabularies larger than this are tested on a coarsened partition (:func:`coarsening`).
COARSEN_ABOVE_VOCAB = 4096
#: Cells of the coarsened partition: each of the ``TOP_CELLS`` most likely tokens of the exact law alone,
#: then ``TAIL_BUCKETS`` buckets of the rest, then one cell of the tokens the law gives probability 0.
TOP_CELLS = 64
TAIL_BUCKETS = 16
COARSE_CELLS = TOP_CELLS + TAIL_BUCKETS + 1


def tested_cells(vocab: int) -> int:
    """How many cells a law over ``vocab`` tokens is tested on (:func:`coarsened`)."""
    return vocab if vocab <= COARSEN_ABOVE_VOCAB else COARSE_CELLS


def coarsening(law: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(cell_of_token, cell_law)``: a partition of the vocabulary fixed by the exact law alone.

    Each of the :data:`TOP_CELLS` most likely tokens (ties by token id) is its own cell; the other
    tokens of the support, in decreasing order of probability, fill :data:`TAIL_BUCKETS` buckets by
    quantiles of their mass (a token goes to the bucket where its share of the tail mass starts);
    every token with probability 0 goes to the last cell. ``cell_law`` is the law's mass per cell.

    Why a test of the coarsened law is valid: the partition is a function of the exact law only
    (never of the counts), so for a lossless generator the cell of each emitted token follows
    ``cell_law`` exactly, i.i.d. within a stratum as the tokens are, and every guarantee of
    :func:`~lossless_check.stats.verdict_test` holds for the cells as it does for the tokens.
    Power is lost only within cells: a bug that moves mass between tokens of one tail bucket is
    invisible; one that moves mass across cells (into or out of the top tokens, between tail
    quantiles) keeps the test's power over a support of at most :data:`COARSE_CELLS` instead of
    ``V``. A support violation stays exact on the full vocabulary: every token of probability 0
    lands in the zero cell, whose expected mass is 0.
    """
    law = np.asarray(law, dtype=np.float64)
    order = np.argsort(-law, kind="stable")
    support = int((law > 0).sum())
    cells = np.full(law.shape[0], COARSE_CELLS - 1, dtype=np.int16)
    top = order[: min(TOP_CELLS, support)]
    cells[top] = np.arange(len(top), dtype=np.int16)
    tail = order[len(top) : support]
    if tail.size:
        mass = law[tail]
        start = (np.cumsum(mass) - mass) / mass.sum()
        cells[tail] = TOP_CELLS + np.minimum((start * TAIL_BUCKETS).astype(np.int64), TAIL_BUCKETS - 1)
    cell_law = np.bincount(cells, weights=law, minlength=COARSE_CELLS)
    cell_law.setflags(write=False)
    return cells, cell_law


def within_cell_tv(law: np.ndarray, cell_of: np.ndarray) -> float:
    """The most total variation a true law can add to its TV from ``law`` on tokens beyond its TV on the
    cells ``cell_of``: ``sum over cells B of p(B) - min_{x in B, p(x) > 0} p(x)`` (a single-token cell
    adds nothing; mass moved onto a token of probability 0 is an exact failure, outside this).

    Why: for a true law ``r`` and a cell ``B``, with ``a = r(B)``, ``b = p(B)`` and the laws within ``B``
    normalised, ``sum_{x in B} |r(x) - p(x)| <= |a - b| + min(a, b) ||r_B - p_B||_1`` and
    ``||r_B - p_B||_1 <= 2 (1 - min_x p_B(x))``; summed over cells, token TV <= cell TV + this."""
    law = np.asarray(law, dtype=np.float64)
    support = law > 0
    cells, mass = cell_of[support].astype(np.int64), law[support]
    if not cells.size:
        return 0.0
    size = int(cells.max()) + 1
    total = np.bincount(cells, weights=mass, minlength=size)
    least = np.full(size, np.inf)
    np.minimum.at(least, cells, mass)
    shared = np.bincount(cells, minlength=size) > 1
    return float((total - least)[shared].sum())


def coarsened(ids: np.ndarray, tokens: np.ndarray, laws: list[np.ndarray],
              vocab: int) -> tuple[np.ndarray, list[np.ndarray], int, list[float]]:
    """``(cells, cell_laws, cells_per_stratum, within)``: the tokens and laws of :func:`stratify`, on
    the partition of :func:`coarsening` when ``vocab`` exceeds :data:`COARSEN_ABOVE_VOCAB` (else
    unchanged), and per law the TV a bug can move inside its cells (:func:`within_cell_tv`; ``None`` on
    tokens). The rule depends on the vocabulary and the laws only."""
    if tested_cells(vocab) == vocab:
        return tokens, laws, vocab, [None] * len(laws)
    parts = [coarsening(law) for law in laws]
    cells = np.zeros(len(tokens), dtype=np.int64)
    for s, (cell_of, _) in enumerate(parts):
        here = ids == s
        cells[here] = cell_of[tokens[here]]
    within = [within_cell_tv(law, cell_of) for law, (cell_of, _) in zip(laws, parts)]
    return cells, [law for _, law in parts], COARSE_CELLS, within


def counts_by_stratum(ids: np.ndarray, tokens: np.ndarray, laws: list[np.ndarray], vocab: int,
                      within: list[float | None] | None = None) -> list[Stratum]:
    kept = ids >= 0
    counts = np.bincount(ids[kept] * vocab + tokens[kept], minlength=len(laws) * vocab)
    within = within or [None] * len(laws)
    return [Stratum(c, law, w) for c, law, w in zip(counts.reshape(len(laws), vocab), laws, within)]


def strata(rows: np.ndarray, position: int, law_of: LawOf, vocab: int) -> list[Stratum]:
    """The rows' tokens at ``position`` counted by stratum (on cells above :data:`COARSEN_ABOVE_VOCAB`)."""
    ids, laws = stratify(rows, position, law_of)
    tokens, laws, cells, within = coarsened(ids, rows[:, position], laws, vocab)
    return counts_by_stratum(ids, tokens, laws, cells, within)


def position_tests(result: CaseResult, strata_by_position: list[list[Stratum]], alpha_case: float,
                   power: float = POWER) -> int:
    """Test the output law at every position; fill ``result``; return the number of support violations.

    Each position gets ``alpha_case / positions`` for :func:`~lossless_check.stats.verdict_test` (the
    L1 test and the likelihood-ratio test, half each) and the case's p-value is their Bonferroni
    combination. Position 1 gives the case's headline TV, its interval and the chi-square / G
    diagnostics; the first failing position (else position 1), when it is a single stratum, gives the
    empirical and expected laws that reports plot. ``result.informative_positions``: the positions
    where some trial met a law that is not a point mass (:mod:`~lossless_check.modes.informativeness`).
    ``power``: the probability at which each ``tv_detectable`` is stated (a case that runs in two
    stages states each at a share of the miss probability, :mod:`~lossless_check.modes.step`).
    """
    alpha_position = alpha_case / len(strata_by_position)
    result.alpha_case = alpha_case
    pvalues, violations, tests = [], 0, []
    for j, position_strata in enumerate(strata_by_position):
        test = verdict_test(position_strata, alpha_position, power)
        tests.append(test)
        violations += test.support_violations
        pvalues.append(test.pvalue)
        result.positions.append({
            "position": j + 1,
            "samples": test.n,
            "strata": len(position_strata),
            "tv": test.statistic,
            "tv_threshold": test.threshold_tv,
            "tv_detectable": test.tv_detectable,
            # What the law tests see: tokens, or cells of each law above COARSEN_ABOVE_VOCAB tokens, where
            # tv_detectable is a TV between cell laws; a token-level TV of tv_detectable + within_cell_tv
            # is detected at the same power (within_cell_tv, sample-weighted over strata).
            "tested_on": "tokens" if all(st.within_cell_tv is None for st in position_strata)
            else f"{COARSE_CELLS} cells",
            "within_cell_tv": _weighted_within(position_strata),
            "p_value": test.pvalue,
            "l1_p_value": test.l1_pvalue,
            "lr_p_value": test.lr_pvalue,
            "lr_log_e_value": test.lr_log_evalue,
            "l1_alpha": test.share_l1 * alpha_position,
            "lr_alpha": (1 - test.share_l1) * alpha_position,
            "rejected_by": list(test.rejected_by),
            "chi2_p_value": test.chi2_pvalue,
            "support_violations": test.support_violations,
            # Trials that met a law that is not a point mass: only they carry evidence about q.
            "informative_samples": sum(st.n for st in position_strata if np.count_nonzero(st.expected) > 1),
        })
        if test.pvalue <= alpha_position:
            result.failed_checks.append(f"output_law@{j + 1}")
    first = tests[0]
    result.tv, result.tv_detectable = first.statistic, first.tv_detectable
    result.tv_ci = tv_confidence_interval(strata_by_position[0])
    result.chi2, result.chi2_dof, result.chi2_p_value, result.g_p_value = (
        first.chi2, first.chi2_dof, first.chi2_pvalue, first.g_pvalue)
    failing = [j for j, t in enumerate(tests) if t.rejects(alpha_position)]
    shown = failing[0] if failing else 0
    if len(strata_by_position[shown]) == 1 and strata_by_position[shown][0].n:
        only = strata_by_position[shown][0]
        result.empirical_law = (only.counts / only.n).tolist()
        result.expected_law = only.expected.tolist()
        result.law_position = shown + 1
    result.p_value = bonferroni_min(pvalues)
    result.informative_positions = [p["position"] for p in result.positions if p["informative_samples"]]
    if violations:
        result.failed_checks.insert(0, "support")
    return violations


def _weighted_within(position_strata: list[Stratum]) -> float:
    """Sample-weighted :func:`within_cell_tv` of a position's strata (0 when tested on tokens)."""
    n = sum(st.n for st in position_strata)
    return sum(st.n * (st.within_cell_tv or 0.0) for st in position_strata) / n if n else 0.0


def log_evalues(emitted: np.ndarray, positions: int, law_of: LawOf, vocab: int = 0) -> np.ndarray:
    """Running log e-values of the output laws, ``(positions + 1, rows)``: one row per position
    (:func:`~lossless_check.stats.mixture_log_evalues` over the rows that reached it, strata as in
    :func:`strata`), then their product (all positions' evidence together).

    ``vocab`` (default: the laws' length) decides the coarsening, as in :func:`strata`. Every row is a
    test martingale over trials for a lossless round: given the earlier trials and
    the earlier positions of its own trial, a trial's token at position ``j`` follows
    ``p_j(. | prefix)`` whenever it reached ``j``.
    """
    return sequential_evidence(emitted, positions, law_of, vocab)[0]


def sequential_evidence(emitted: np.ndarray, positions: int, law_of: LawOf,
                        vocab: int = 0) -> tuple[np.ndarray, bool]:
    """``(log_evalues(...), outside_support)`` from one stratification: whether any emitted token has
    probability 0 given its prefix (an exact failure, which the e-values leave out)."""
    trials = len(emitted)
    result, outside_support = [], False
    for j in range(positions):
        reached = np.flatnonzero(emitted[:, j] >= 0) if j < emitted.shape[1] else np.zeros(0, dtype=np.int64)
        per_trial = np.zeros(trials)
        if reached.size:
            ids, laws = stratify(emitted[reached], j, law_of)
            tokens, laws, _, _ = coarsened(ids, emitted[reached, j], laws, vocab or (len(laws[0]) if laws else 0))
            outside_support = outside_support or bool((np.stack(laws)[ids, tokens] <= 0).any())
            running = mixture_log_evalues(ids, tokens, laws)
            per_trial[reached] = np.diff(running, prepend=0.0)
        result.append(np.cumsum(per_trial))
    result.append(np.sum(result, axis=0))
    return np.array(result), outside_support


def combined_log_evalue(log_e: np.ndarray) -> np.ndarray:
    """The mean of the e-value rows (an e-value process itself), in logs."""
    return logsumexp(log_e, axis=0) - math.log(len(log_e))


def stop_sequentially(result_at: Callable[[int | None, float], CaseResult], log_e: np.ndarray, alpha_case: float,
                      final: bool, exact_failure_seen: bool) -> CaseResult | None:
    """A sequential case at one look: its result if it stops here, else ``None``.

    ``alpha_case`` is split in halves. One half goes to an anytime-valid test: the mean of the test
    martingales ``log_e`` (one per position, and their product) is watched after every trial, and
    the case stops at the first trial where it reaches ``2 / alpha_case`` (Ville's inequality: under
    the null this happens with probability at most ``alpha_case / 2``, however long the run). The
    other half goes to the fixed-sample tests at the planned sample count, which give the
    ``tv_detectable`` guarantee of a clean pass. An exact failure stops the case at the look that
    sees it. ``result_at(trials, alpha)`` analyses the first ``trials`` trials (all: ``None``) at ``alpha``.
    """
    combined = combined_log_evalue(log_e)
    crossed = np.flatnonzero(combined >= math.log(2.0 / alpha_case))
    rejected = crossed.size > 0
    if not (rejected or final or exact_failure_seen):
        return None
    trials = int(crossed[0]) + 1 if rejected else log_e.shape[1]
    result = result_at(trials if rejected else None, alpha_case / 2)
    result.log_e_value = float(combined[:trials].max())
    p_anytime = min(1.0, math.exp(-result.log_e_value))
    if final and not rejected:
        result.p_value = min(1.0, 2 * min(p_anytime, result.p_value))
    else:
        # Stopped before the planned sample count: the fixed-sample tests' level does not hold here.
        result.p_value = min(1.0, 2 * p_anytime)
        result.failed_checks = [c for c in result.failed_checks if c in EXACT_CHECKS]
        if rejected:
            # A position's own e-process past 2 * rows / alpha_case rejects that position's law at
            # level alpha_case / (2 * rows) (Ville, Bonferroni over the rows): where the bug is.
            level = math.log(2.0 * len(log_e) / alpha_case)
            result.failed_checks += [f"output_law@{j + 1}" for j, row in enumerate(log_e[:-1, :trials])
                                     if row.max() >= level]
            result.failed_checks.append("e_value")
    for entry, row in zip(result.positions, log_e):
        entry["log_e_value"] = float(row[trials - 1])
    result.alpha_case = alpha_case
    return result
