"""Exact laws: what plain sampling with the same config emits, and the acceptance law of a round.

The laws are computed the way the real path computes them: the fixed logits of the scenario as the
stub models emit them (in the scenario's dtype: float32, or bf16/fp16 as a half-precision model
returns them), upcast to float32, through the installed ``LogitsProcessorList`` (captured from
``generate()``) in float32, softmax in float32 (as ``_sample`` and ``_speculative_sampling`` do),
and only then converted to float64 and renormalised for the statistics.

Why upcast: on 5.24 both samplers upcast the target's logits before the processors and the softmax:
``_sample`` takes ``outputs.logits[:, -1].to(copy=True, dtype=torch.float32)`` (``generation/utils.py``
line 3247) and ``_assisted_decoding`` takes ``outputs.logits[...].to(dtype=torch.float32)`` ("needed
to retain precision", lines 4102-4104) before the processors (4106-4108) and ``_speculative_sampling``
(softmax of ``new_logits`` at line 4466). So the target's law is that of the *rounded* table, in
float32: rounding can tie two logits (``markov8-bf16``: 1.759 and 1.757 both become 1.7578125), and a
tie at the ``top_k`` boundary keeps one token more, which a law of the unrounded table would call
impossible. ``candidate_logits`` get no such upcast: ``_speculative_sampling`` softmaxes them in the
dtype the generator returns (line 4464); see :mod:`fixtures.mutants.dflash_half_precision_q`. So a token is impossible
here exactly when it is impossible for the real sampler: a warper's cutoff decided in float64 could
remove a token that float32 keeps (``EpsilonLogitsWarper(0.06)`` on a token at the cutoff), and
a support violation is an exact failure. The reference for "lossless" is always plain sampling with
the same generation config.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
import torch

from lossless_check.core.errors import PlainSamplingFails
from lossless_check.laws.scenarios import Scenario
from lossless_check.laws.tables import FixedLogits
from lossless_check.stats import AcceptanceLaw

#: Acceptance-law enumeration visits at most this many drafted prefixes.
MAX_ENUMERATED_PREFIXES = 50_000


#: The dtype of the real path: the stubs' logits, the processors, the sampler's and verifier's softmax.
REAL_PATH_DTYPE = torch.float32


#: Processors whose output is a function of the scores alone, never of ``input_ids`` (class names in
#: ``transformers.generation.logits_process``; ``tests/test_tables_and_warpers.py`` checks each on the
#: installed release). Under a stack of only these, the processed law after a prefix is that of the
#: table row the stub emits there, computed once per row: at V = 49,152 a law costs about 2 ms, and a
#: case meets thousands of distinct prefixes but a handful of rows.
HISTORY_FREE = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "TopHLogitsWarper",
                "MinPLogitsWarper", "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper",
                "SuppressTokensLogitsProcessor", "LogitNormalization", "InfNanRemoveLogitsProcessor")


def history_free(processors) -> bool:
    """Whether every processor is, by its exact class, one of :data:`HISTORY_FREE` (a subclass may read the history)."""
    from transformers.generation import logits_process

    free = {getattr(logits_process, name) for name in HISTORY_FREE if hasattr(logits_process, name)}
    return processors is None or all(type(processor) in free for processor in processors)


def processed(processors, history: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``processors(history, logits)``; :class:`~.errors.PlainSamplingFails` if the installed processors
    raise (e.g. ``EtaLogitsWarper`` before 5.0 on a row that ``no_repeat_ngram_size`` emptied)."""
    try:
        return processors(history, logits)
    except Exception as exc:  # noqa: BLE001 - any failure of the release's own processors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise plain_sampling_fails(history[0].tolist(), f"{type(exc).__name__}: {first[:160]}") from None


def plain_sampling_fails(history: list[int], why: str) -> PlainSamplingFails:
    return PlainSamplingFails(f"plain sampling under this stack fails on the installed transformers after "
                              f"tokens {history}: {why}")


def unsampleable(logits: torch.Tensor) -> torch.Tensor:
    """Rows (last dimension) whose softmax is NaN, which ``torch.multinomial`` refuses: a NaN or
    ``+inf`` logit, or no finite logit at all (every token removed)."""
    return torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1) | ~torch.isfinite(logits).any(-1)


#: Why plain sampling fails on an :func:`unsampleable` row.
UNSAMPLEABLE = ("the processed logits are NaN, +inf or all -inf (e.g. every token removed, or a penalty "
                "added to a removed token), so torch.multinomial refuses their softmax")


def law_as_sampled(logits: torch.Tensor) -> np.ndarray:
    """The law ``torch.multinomial(softmax(logits))`` samples from, for processed logits of the real dtype.

    Softmax in the logits' own dtype (float32 on the real path), then float64 and renormalised so the
    statistics see probabilities that sum to 1; a probability is 0 here iff it is 0 in that dtype.
    """
    probs = torch.softmax(logits, dim=-1).to(torch.float64).numpy()
    probs = probs / probs.sum()
    probs.setflags(write=False)
    return probs


class ExactLaws:
    """Exact next-token laws of the processed target and drafter after ``prompt + prefix``."""

    def __init__(self, scenario: Scenario, processors):
        self.scenario = scenario
        self.processors = processors
        # Identical laws share one array (keyed by a digest, confirmed equal): with a large vocabulary
        # and a history-free stack, every prefix has the same law, and one copy per prefix would cost
        # 256 kB each.
        self._interned: dict[bytes, np.ndarray] = {}
        self._target = lru_cache(maxsize=None)(lambda prefix: self._law(scenario.target, prefix))
        self._drafter = lru_cache(maxsize=None)(lambda prefix: self._law(scenario.drafter, prefix))
        #: Under a :func:`history_free` stack, the laws by ``(table, row)``.
        self._by_row: dict[tuple[int, int], np.ndarray] | None = {} if history_free(processors) else None

    def _law(self, table: FixedLogits, prefix: tuple[int, ...]) -> np.ndarray:
        history = self.scenario.prompt + prefix
        if self._by_row is None:
            return self._computed(table, prefix, history)
        key = (id(table), int(table.row_index(np.asarray([len(prefix)]), np.asarray([history[-1]]))[0]))
        law = self._by_row.get(key)
        if law is None:  # a failure is not kept: each prefix that meets it says so with its own history
            law = self._by_row[key] = self._computed(table, prefix, history)
        return law

    def _computed(self, table: FixedLogits, prefix: tuple[int, ...], history: tuple[int, ...]) -> np.ndarray:
        # As emitted (the table's dtype), then upcast as _sample / _assisted_decoding do; a padded
        # drafter's extra columns are no tokens of the target: a correct drafter never drafts them.
        logits = table.emitted(len(prefix), history[-1])[None, : self.scenario.vocab_size].to(REAL_PATH_DTYPE)
        if self.processors is not None and len(self.processors) > 0:
            logits = processed(self.processors, torch.tensor([history], dtype=torch.long), logits)
        if bool(unsampleable(logits).any()):
            raise plain_sampling_fails(list(history), UNSAMPLEABLE)
        law = law_as_sampled(logits[0])
        key = hashlib.blake2b(law.tobytes(), digest_size=16).digest()
        shared = self._interned.setdefault(key, law)
        return shared if shared is law or np.array_equal(shared, law) else law

    def target(self, prefix: tuple[int, ...] = ()) -> np.ndarray:
        """Law of the next token after ``prompt + prefix`` under plain sampling (processed target)."""
        return self._target(tuple(prefix))

    def drafter(self, prefix: tuple[int, ...] = ()) -> np.ndarray:
        """Law a correct drafter samples the next draft from: the processed drafter table (over the
        target's vocabulary: a padded drafter's extra columns suppressed)."""
        return self._drafter(tuple(prefix))

    def residual(self, prefix: tuple[int, ...] = ()) -> np.ndarray | None:
        """Law of the token emitted after a rejection: ``normalize(max(p - q, 0))`` (None if p <= q)."""
        residual = np.maximum(self.target(prefix) - self.drafter(prefix), 0.0)
        total = residual.sum()
        return residual / total if total > 0 else None

    def acceptance_law(self, gamma: int) -> AcceptanceLaw | None:
        """Exact law of ``n_matches`` when drafts come from :meth:`drafter` (``None`` if too large).

        Draft ``j`` is accepted with probability ``a_j = sum_x min(p_j(x), q_j(x))`` given the
        accepted prefix, and an accepted token ``x`` has weight ``min(p_j(x), q_j(x))``.
        """
        law = np.zeros(gamma + 1)
        visited = 0
        stack: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
        while stack:
            prefix, weight = stack.pop()
            visited += 1
            # Every stacked prefix will be visited: past the cap already, give up before computing
            # the laws of prefixes whose sum is never used (2,500 laws, 3 s, at V = 49,152).
            if visited + len(stack) > MAX_ENUMERATED_PREFIXES:
                return None
            if len(prefix) == gamma:
                law[gamma] += weight
                continue
            overlap = np.minimum(self.target(prefix), self.drafter(prefix))
            law[len(prefix)] += weight * (1.0 - overlap.sum())
            for token in np.flatnonzero(overlap > 0):
                stack.append((prefix + (int(token),), weight * float(overlap[token])))
        return AcceptanceLaw(law)


def first_token_law(p: np.ndarray, q_sampled: np.ndarray, q_returned: np.ndarray) -> np.ndarray:
    """Exact law of the first emitted token when drafts come from ``q_sampled`` but ``q_returned`` is the q.

    Algorithm 1 accepts draft ``x`` with probability ``min(1, p(x) / q_returned(x))`` and otherwise
    samples ``normalize(max(p - q_returned, 0))``. With ``q_sampled == q_returned`` this is ``p``:
    the gap is what a generator that breaks the q contract costs (a negative control's true TV).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        # As torch computes it: p / 0 = inf accepts, 0 / 0 = nan rejects.
        ratio = np.where(q_returned > 0, np.minimum(1.0, p / q_returned), (p > 0).astype(float))
    accepted = q_sampled * ratio
    residual = np.maximum(p - q_returned, 0.0)
    rejected = 1.0 - accepted.sum()
    if residual.sum() > 0:
        return accepted + rejected * residual / residual.sum()
    return accepted / accepted.sum()


class GreedyLaws:
    """Plain greedy decoding's next-token law after ``prompt + prefix``: a point mass on the argmax.

    The argmax of the target's processed logits, in the real path's dtype, first index on ties (as
    ``torch.argmax`` in ``_sample`` and ``_assisted_decoding``).
    """

    def __init__(self, scenario, processors):
        self.scenario = scenario
        self.processors = processors
        self._cache: dict[tuple[int, ...], np.ndarray] = {}

    def target(self, prefix: tuple[int, ...] = ()) -> np.ndarray:
        prefix = tuple(prefix)
        law = self._cache.get(prefix)
        if law is None:
            history = self.scenario.prompt + prefix
            logits = self.scenario.target.emitted(len(prefix), history[-1]).to(REAL_PATH_DTYPE)[None]
            if self.processors is not None and len(self.processors) > 0:
                logits = processed(self.processors, torch.tensor([history], dtype=torch.long), logits)
            law = np.zeros(self.scenario.vocab_size)
            law[int(torch.argmax(logits[0]))] = 1.0
            law.setflags(write=False)
            self._cache[prefix] = law
        return law
