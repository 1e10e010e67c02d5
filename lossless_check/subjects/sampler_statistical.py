"""The statistical check of a user's rejection sampler: its emitted law, position by position, over many
draft/target pairs, with real randomness.

Each design is a pair of Markov tables over a small vocabulary: the target's law at position ``j`` given
the token before it, ``p_j(. | prev)``, and the drafter's, ``q_j(. | prev)``. A trial draws the drafts
``d_i ~ q_i(. | d_{i-1})`` (the harness's own seeded numpy stream), hands the sampler the rows its drafts
select (``target_probs[j] = p_j(. | d_{j-1})``, ``draft_probs[i] = q_i(. | d_{i-1})``; transformers'
protocol gets their logs as logits) and records what it emits. A lossless round emits, at every position
``j`` it reaches, a token distributed as ``p_j(. | d_{j-1})`` given the accepted drafts before it (see
:mod:`.sampler_exact`): so the counts at position ``j``, one stratum per previous token, are tested
against those laws with the project's verdict test (:func:`~lossless_check.stats.verdict_test`: the L1
test and the likelihood-ratio e-value, each finite-sample valid), and the tests of every position of
every design are decided together by Holm at the family rate ``alpha``.

- False-failure rate: at most ``alpha`` for a lossless sampler (Holm over tests each valid at every
  sample size; the strata of a position are independent given their sizes, which depend only on earlier
  positions). A token of target probability 0, a call that raises or a malformed return is an exact failure.
- Power: each test states the total variation it detects with probability 0.99
  (``tv_detectable``, the sample-weighted TV over its strata, at the Bonferroni level ``alpha / m``, which
  Holm never makes stricter); the report states position 1's, where every trial counts.

The designs cover dense and sparse laws, drafts of target probability 0, an argmax drafter (point-mass
q), a point-mass target, ``p = q`` (every draft accepted: the bonus row), ties, disjoint supports, one
draft and four, and a 64-token vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from lossless_check.stats import Stratum, holm_correction, verdict_test
from lossless_check.subjects.sampler import Sampler, SamplerFailure

#: Power at which ``tv_detectable`` is stated.
POWER = 0.99
#: The token before the drafts (the prompt's last token) in every trial.
PROMPT_TOKEN = 0


@dataclass(frozen=True)
class TablePair:
    """Target ``p[j, prev]`` (``(k + 1, V, V)``) and drafter ``q[i, prev]`` (``(k, V, V)``), float32 laws."""

    name: str
    p: np.ndarray
    q: np.ndarray

    @property
    def k(self) -> int:
        return self.q.shape[0]

    @property
    def vocab(self) -> int:
        return self.p.shape[-1]


def _float32_laws(laws: np.ndarray) -> np.ndarray:
    """Laws as torch computes them from their float32 logits (exact zeros kept), normalised in float64: the
    law tests take laws that sum to 1 (a float32 softmax sums to 1 within 1e-7, and the L1 test's tail
    bound then reads a single sample on a support of three tokens of 0.33333334 as impossible)."""
    with np.errstate(divide="ignore"):
        logits = torch.tensor(np.log(laws), dtype=torch.float32)
    probs = logits.softmax(-1).double().numpy()
    return probs / probs.sum(-1, keepdims=True)


def _sparse(rng, shape, vocab: int, low: int = 1) -> np.ndarray:
    """Dirichlet rows on random supports of ``low`` to ``vocab`` tokens."""
    laws = rng.dirichlet(np.ones(vocab), size=shape)
    sizes = rng.integers(low, vocab + 1, size=shape)
    ranks = np.argsort(rng.random(shape + (vocab,)), axis=-1).argsort(axis=-1)
    laws = np.where(ranks < sizes[..., None], laws, 0.0)
    return laws / laws.sum(-1, keepdims=True)


def _one_hot(rng, shape, vocab: int) -> np.ndarray:
    return np.eye(vocab)[rng.integers(0, vocab, size=shape)]


def _ties(rng, shape, vocab: int) -> np.ndarray:
    support = rng.random(shape + (vocab,)) < 0.5
    support[..., 0] |= ~support.any(-1)
    return support / support.sum(-1, keepdims=True)


def _zipf(rng, k: int, vocab: int) -> np.ndarray:
    law = 1.0 / np.arange(1, vocab + 1) ** 1.1
    rows = np.stack([rng.permutation(law) for _ in range(k)])
    return np.broadcast_to((rows / rows.sum(-1, keepdims=True))[:, None, :], (k, vocab, vocab)).copy()


def designs(seed: int) -> list[TablePair]:
    """The draft/target pairs, drawn from ``seed`` (the same tables for the same seed)."""
    rng = np.random.default_rng([52, seed])
    v = 8

    def pair(name, k, p_of, q_of, vocab=v):
        return TablePair(name, _float32_laws(p_of((k + 1, vocab), vocab)), _float32_laws(q_of((k, vocab), vocab)))

    dense = lambda shape, vocab: rng.dirichlet(np.ones(vocab), size=shape)
    sparse = lambda shape, vocab: _sparse(rng, shape, vocab)
    wide = lambda shape, vocab: _sparse(rng, shape, vocab, low=vocab // 2)
    one_hot = lambda shape, vocab: _one_hot(rng, shape, vocab)
    ties = lambda shape, vocab: _ties(rng, shape, vocab)
    shared = rng.dirichlet(np.ones(v), size=(4, v))
    equal = TablePair("p = q (every draft accepted; the bonus row decides)",
                      _float32_laws(np.concatenate([shared, rng.dirichlet(np.ones(v), size=(1, v))])),
                      _float32_laws(shared))
    halves = rng.permutation(v)
    on = lambda tokens: lambda shape, vocab: _on(rng, shape, vocab, tokens)
    zipf_p, zipf_q = _zipf(rng, 4, 64), _zipf(rng, 3, 64)
    return [
        pair("dense laws", 3, dense, dense),
        pair("sparse laws (drafts of target probability 0)", 3, sparse, sparse),
        pair("argmax drafter (point-mass q)", 3, sparse, one_hot),
        pair("point-mass target", 2, one_hot, wide),
        equal,
        pair("ties (uniform on subsets)", 3, ties, ties),
        pair("disjoint supports (every draft rejected)", 2, on(halves[:4]), on(halves[4:])),
        pair("one draft", 1, dense, sparse),
        TablePair("64 tokens, Zipf-like laws", _float32_laws(zipf_p), _float32_laws(zipf_q)),
    ]


def _on(rng, shape, vocab: int, tokens) -> np.ndarray:
    laws = np.zeros(shape + (vocab,))
    laws[..., tokens] = rng.dirichlet(np.ones(len(tokens)), size=shape)
    return laws


@dataclass
class PositionTest:
    """One position of one design: its test's statistics (``p_value`` before Holm)."""

    design: str
    position: int
    samples: int
    tv: float
    tv_detectable: float
    p_value: float
    rejected_by: tuple[str, ...] = ()
    p_value_adjusted: float | None = None


@dataclass
class StatisticalOutcome:
    """The statistical check: every position test, exact failures seen, and the family decision."""

    alpha: float
    samples: int
    tests: list[PositionTest] = field(default_factory=list)
    exact_failures: list[str] = field(default_factory=list)

    @property
    def rejected(self) -> list[PositionTest]:
        return [t for t in self.tests if t.p_value_adjusted is not None and t.p_value_adjusted <= self.alpha]

    @property
    def failed(self) -> bool:
        return bool(self.exact_failures or self.rejected)

    @property
    def p_value(self) -> float:
        """The family's combined p-value (the smallest Holm-adjusted one); 1 with no test."""
        return min((t.p_value_adjusted for t in self.tests), default=1.0)

    @property
    def tv_detectable(self) -> float:
        """The largest position-1 ``tv_detectable`` over the designs: every design detects at least this."""
        return max((t.tv_detectable for t in self.tests if t.position == 1), default=1.0)


def _draw(rng, laws: np.ndarray) -> np.ndarray:
    """One token per row of ``laws`` (rows: trials), by inverse CDF of the harness's own uniforms."""
    cdf = np.cumsum(laws, axis=-1)
    u = rng.random(len(laws)) * cdf[:, -1]
    return np.minimum((u[:, None] >= cdf).sum(-1), laws.shape[-1] - 1)


def run_design(sampler: Sampler, design: TablePair, samples: int, seed: int) -> tuple[list[list[int]], list[np.ndarray],
                                                                                       str | None]:
    """``samples`` trials: the emitted tokens, the drafts, and the first exact failure (then it stops)."""
    rng = np.random.default_rng([52, seed, 1])
    k = design.k
    drafts = np.zeros((samples, k), dtype=np.int64)
    prev = np.full(samples, PROMPT_TOKEN)
    for i in range(k):
        drafts[:, i] = _draw(rng, design.q[i, prev])
        prev = drafts[:, i]
    p32 = torch.tensor(design.p, dtype=torch.float32)
    q32 = torch.tensor(design.q, dtype=torch.float32)
    emitted = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(rng.integers(2**62)))
        for t in range(samples):
            row = drafts[t].tolist()
            before = [PROMPT_TOKEN] + row
            target = p32[torch.arange(k + 1), before]
            draft = q32[torch.arange(k), before[:k]]
            try:
                tokens = sampler.emit(target, draft, row)
            except SamplerFailure as exc:
                return emitted, list(drafts[: len(emitted)]), f"drafts {row}: {exc}"
            for j, token in enumerate(tokens):
                if design.p[j, before[j], token] == 0:
                    what = "accepts draft" if j < len(tokens) - 1 else "emits"
                    return emitted, list(drafts[: len(emitted)]), (
                        f"drafts {row}: {what} {token} at position {j + 1}, where the target gives it probability 0 "
                        f"(emits {tokens})")
            emitted.append(tokens)
    return emitted, list(drafts), None


def position_strata(design: TablePair, emitted: list[list[int]], drafts: list[np.ndarray], j: int) -> list[Stratum]:
    """Position ``j`` (0-based): the trials that reached it, one stratum per token before it."""
    counts: dict[int, np.ndarray] = {}
    for tokens, row in zip(emitted, drafts):
        if len(tokens) > j:
            prev = PROMPT_TOKEN if j == 0 else int(row[j - 1])
            counts.setdefault(prev, np.zeros(design.vocab, dtype=np.int64))[tokens[j]] += 1
    return [Stratum(c, design.p[j, prev]) for prev, c in sorted(counts.items())]


def statistical_check(sampler: Sampler, samples: int, alpha: float, seed: int = 0) -> StatisticalOutcome:
    """Every design of :func:`designs` at ``samples`` trials each; Holm over every position at ``alpha``."""
    tables = designs(seed)
    outcome = StatisticalOutcome(alpha, samples)
    level = alpha / sum(d.k + 1 for d in tables)  # Bonferroni's level: what tv_detectable is stated at
    for d, design in enumerate(tables):
        emitted, drafts, failure = run_design(sampler, design, samples, seed * 1009 + d)
        if failure is not None:
            outcome.exact_failures.append(f"{design.name}: {failure}")
            continue
        for j in range(design.k + 1):
            strata = position_strata(design, emitted, drafts, j)
            if not strata:
                continue
            result = verdict_test(strata, level, POWER)
            outcome.tests.append(PositionTest(design.name, j + 1, result.n, result.statistic, result.tv_detectable,
                                              result.pvalue, result.rejected_by))
    # Holm over the whole family fixed in advance: a position no trial reached counts as a p-value of 1.
    unreached = sum(d.k + 1 for d in tables) - len(outcome.tests)
    adjusted = holm_correction([t.p_value for t in outcome.tests] + [1.0] * unreached)
    for test, value in zip(outcome.tests, adjusted):
        test.p_value_adjusted = float(value)
    return outcome
