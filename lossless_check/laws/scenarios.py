"""Named fixed-logits scenarios: a target table, a drafter table and a prompt.

The default scenario is small enough to enumerate exactly (vocabulary 8) and chosen so that the
drafter and target disagree (acceptance rate well below 1) and every common warper bites: no
single token dominates, and mass is spread over more tokens than ``top_k=3`` keeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from lossless_check.core.errors import UsageError
from lossless_check.laws.lm49k import (
    LM_POSITIONS, LM_TOP_K, UPSTREAM_KEPT_MASS, VOCAB_LM, lm49k_tables, _quantile_name, kept_mass, quantile_summary,
)
from lossless_check.laws.tables import FixedLogits

#: How a scenario's tokenizers give their vocabulary (built by :func:`.adapters.vocabularies.tokenizer_pair`;
#: named here so that this module imports neither torch nor ``tokenizers``).
TOKENIZER_KINDS = ("stub", "fast", "id-ordered", "bpe", "bpe-id-ordered")
#: The caches a target may keep its history in besides one full-attention layer (the stubs of
#: :mod:`.stateful`, which imports torch: named here so that this module does not).
TARGET_KIND_NAMES = ("linear", "hybrid", "sliding", "static", "linear-full", "linear-sliding", "indexed",
                     "static-indexed")
#: The kinds that add one more cache layer's ``crop`` to those of the first four (a linear state beside keys,
#: an indexer key cache): their law and their states are the first four's, so the warper matrix meets the
#: rollback on those; these run the ``smoke`` stacks in generate mode (:func:`~lossless_check.faces.case_lists.stateful_cases`).
CROP_ONLY_KINDS = ("linear-full", "linear-sliding", "indexed", "static-indexed")


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
    #: tokenizers with ``get_vocab()`` in id order: the control); ``bpe`` and ``bpe-id-ordered``: the
    #: same two orders over byte-level BPE tokenizers trained offline, whose target vocabulary must be
    #: the scenario's (300 tokens). See :mod:`.adapters.vocabularies`.
    tokenizers: str = "stub"
    #: What the scenario is for, shown by ``lossless-check list``.
    description: str = ""
    #: The dtype both stub models emit their logits in (``float32``, ``bfloat16``, ``float16``), as a
    #: real model in that precision returns them. It overrides the tables' own (float32) dtype.
    dtype: str = "float32"
    #: Where the target keeps its history: ``None``, one full-attention layer
    #: (:class:`~lossless_check.laws.stubs.FixedLogitsLM`); else a :data:`TARGET_KIND_NAMES` kind, the
    #: linear-attention, hybrid, sliding-window and static-cache targets of :mod:`.stateful`, which the
    #: loop rolls back after a rejection (generate and greedy modes).
    target_kind: str | None = None

    def __post_init__(self) -> None:
        for side in ("target", "drafter"):
            table = getattr(self, side)
            if table.dtype not in ("float32", self.dtype):
                raise UsageError(f"scenario {self.name!r}: the {side} table is {table.dtype}, the scenario {self.dtype}")
            # Frozen: set once, here, so every stub built from the scenario emits its dtype.
            object.__setattr__(self, side, table.in_dtype(self.dtype))
        # A drafter may have more columns than the target (a padded lm_head, see
        # :data:`PADDED_DRAFTER`): its extra ids are not tokens of the target. Fewer would leave
        # target tokens the drafter cannot score.
        if self.drafter.vocab_size < self.target.vocab_size:
            raise UsageError(
                f"scenario {self.name!r}: drafter vocabulary {self.drafter.vocab_size} < target vocabulary "
                f"{self.target.vocab_size}"
            )
        if not self.prompt:
            raise UsageError(f"scenario {self.name!r}: the prompt must hold at least one token")
        if any(not 0 <= t < self.vocab_size for t in self.prompt):
            raise UsageError(f"scenario {self.name!r}: prompt tokens must lie in [0, {self.vocab_size})")
        if self.tokenizers not in TOKENIZER_KINDS:
            raise UsageError(f"scenario {self.name!r}: tokenizers must be one of {', '.join(TOKENIZER_KINDS)}")
        if self.target_kind is not None and self.target_kind not in TARGET_KIND_NAMES:
            raise UsageError(f"scenario {self.name!r}: target_kind must be one of {', '.join(TARGET_KIND_NAMES)}")
        if self.gamma < 1:
            raise UsageError(f"scenario {self.name!r}: gamma must be >= 1")

    def __reduce__(self):
        # A registered scenario travels to a worker by name (rebuilt, or taken from the worker's
        # cache, there): lm49k's tables are 50 MB, sent with every case task otherwise.
        if SCENARIOS.built(self.name) is self:
            return (_registered, (self.name,))
        return super().__reduce__()

    @property
    def vocab_size(self) -> int:
        """The target's vocabulary: the tokens the output law is over."""
        return self.target.vocab_size

    @property
    def drafter_padding(self) -> int:
        """Columns of the drafter's logits past the target's vocabulary (0 unless its head is padded)."""
        return self.drafter.vocab_size - self.target.vocab_size


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

#: Vocabulary of the byte-level BPE scenarios: the target BPE tokenizer's (256 byte tokens, ids 0-255,
#: then 44 merges, :mod:`.adapters.vocabularies`). The assistant's has 290 (``<|endoftext|>``, the
#: bytes, 33 merges); 268 tokens are shared (the bytes and 12 merges), every one under another id.
VOCAB_BPE = 300
#: The target BPE's single-byte tokens: ids below this.
_BPE_BYTES = 256
#: Seeded logits over the target BPE vocabulary, 4 lower on the single-byte tokens, as a model that
#: has learnt the merges puts little mass on raw bytes: 15% of the target's mass on the 256 bytes,
#: 49% on the 32 target-only merges (q = 0 there for Universal: the residual must supply them), 35%
#: on the 12 shared merges. The drafter adds seeded noise; its seed makes the assistant's argmax the
#: target's (``Ġon``), so greedy drafts of DifferentTokenizers get accepted.
_BPE_BASE = _seeded(20261204, (VOCAB_BPE,), 1.4) - 4.0 * (np.arange(VOCAB_BPE) < _BPE_BYTES)
#: "the cat sat on the mat and the dog sat on the" in target BPE ids (12 tokens; 20 for the
#: assistant): ASCII text that decodes and re-encodes exactly, as the generators re-tokenize the
#: prompt through text. Longer than DifferentTokenizers' look-behind windows (10 tokens each side,
#: 5.24 ``candidate_generator.py`` 554/598): with a shorter assistant prompt, line 598's negative
#: start index re-reads only the tail of the drafts and the generator proposes nothing (measured with
#: "the cat sat on the": no candidates in the first two rounds; greedy verification stays lossless).
_BPE_PROMPT = (257, 271, 284, 272, 259, 279, 269, 259, 268, 284, 272, 259)

#: Universal and DifferentTokenizers with byte-level BPE fast tokenizers trained offline on two
#: corpora (different but overlapping vocabularies), nothing overridden: ``get_vocab()`` in the
#: library's hash order.
BPE_FAST_TOKENIZERS = Scenario(
    name="bpe-fast-tokenizers",
    target=FixedLogits.iid(_BPE_BASE),
    drafter=FixedLogits.iid(_BPE_BASE + _seeded(6, (VOCAB_BPE,), 0.8)),
    prompt=_BPE_PROMPT,
    gamma=3,
    tokenizers="bpe",
    description="byte-level BPE fast tokenizers (300 and 290 tokens, 268 shared, hash-ordered get_vocab) "
                "for the generators with two vocabularies",
)

#: The control of :data:`BPE_FAST_TOKENIZERS`: the same tokenizers with ``get_vocab()`` in id order.
BPE_ID_ORDERED_VOCAB = replace(
    BPE_FAST_TOKENIZERS,
    name="bpe-id-ordered-vocab",
    tokenizers="bpe-id-ordered",
    description="control of bpe-fast-tokenizers: the same BPE tokenizers, get_vocab() in id order",
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
#: (acceptance near 0.8). Laws are tested on the coarsened partition of :func:`~lossless_check.evidence.analysis.coarsening`.
LARGE_VOCAB = Scenario(
    name="zipf32k",
    target=FixedLogits.iid(_ZIPF),
    drafter=FixedLogits.iid(_ZIPF + _seeded(4, (VOCAB_LARGE,), 0.5)),
    prompt=(3, 1, 4),
    gamma=3,
    description="vocabulary 32,000, Zipf-like peaked laws with long tails (laws tested on 64 top cells + 16 tail buckets)",
)

# --- Half precision: the stubs emit their logits in bf16 / fp16, as real models do. --------------

#: The default scenario in bf16. Rounding to bf16 ties two logits of the target's row after token 4
#: (1.759 and 1.757 both become 1.7578125, its 2nd and 3rd largest): under ``top_k=2`` the real
#: sampler keeps 3 tokens there (``TopKLogitsWarper`` keeps every logit equal to the k-th), so the
#: expected law must be the rounded table's (:mod:`.expected`), or a lossless generator fails on support.
MARKOV_BF16 = replace(
    DEFAULT,
    name="markov8-bf16",
    dtype="bfloat16",
    description="markov8 with bf16 logits (a top_k=2 tie that only the rounded table has, after token 4)",
)

#: The large-vocabulary pair in bf16: bf16 keeps float32's exponent range (no q underflows), but a
#: softmax *in* bf16 quantises every q to 8 significant bits: TV 6e-4 from the float32 softmax of the
#: same bf16 logits (drafter table), far below statistics, above provenance's 1e-5.
LARGE_VOCAB_BF16 = replace(
    LARGE_VOCAB,
    name="zipf32k-bf16",
    dtype="bfloat16",
    description="zipf32k with bf16 logits (a bf16 softmax quantises q: TV 6e-4 from the float32 one)",
)

#: The large-vocabulary pair in fp16: a softmax in fp16 rounds every probability below 2**-25
#: (3.0e-8) to 0 and quantises the subnormal range coarsely: 175 tokens of the drafter's law
#: (mass 4.2e-6) underflow to q = 0.
LARGE_VOCAB_FP16 = replace(
    LARGE_VOCAB,
    name="zipf32k-fp16",
    dtype="float16",
    description="zipf32k with fp16 logits (an fp16 softmax underflows 175 drafter tokens to q = 0)",
)

# --- A padded drafter vocabulary ------------------------------------------------------------------

#: Columns of padding on the padded drafter's head (the padded head is 16 wide for 8 tokens).
DRAFTER_PADDING = 8
#: The logit of a padded column: a zero-initialised row of ``lm_head`` (no bias) gives exactly 0.
PADDING_LOGIT = 0.0

#: :data:`IID` with the drafter's head padded past the target's vocabulary, as released families pad
#: ``lm_head`` (and ``config.vocab_size``) to a multiple of 64 or 128 beyond the tokenizer. Ids 8-15
#: are no tokens of the target; their logit 0 gives them 23% of the drafter's raw mass (a magnified
#: toy: real padding holds little mass, but a generator must handle any).
PADDED_DRAFTER = Scenario(
    name="iid8-padded-drafter",
    target=IID.target,
    drafter=FixedLogits.iid(np.concatenate([IID.drafter.rows[0], np.full(DRAFTER_PADDING, PADDING_LOGIT)])),
    prompt=IID.prompt,
    gamma=IID.gamma,
    description=f"iid8 with the drafter's lm_head padded to {VOCAB + DRAFTER_PADDING} columns (padding logits 0)",
)

# --- A real vocabulary at real effect sizes ---------------------------------------------------------


def _lm49k() -> Scenario:
    target, drafter = lm49k_tables()
    kept = quantile_summary(kept_mass(drafter.rows, LM_TOP_K))
    upstream = ", ".join(f"{_quantile_name(q)} {z:.2f}" for q, z in UPSTREAM_KEPT_MASS.items() if 0 < q < 1)
    return Scenario(
        name="lm49k",
        target=target,
        drafter=drafter,
        prompt=(3, 1, 4),
        gamma=3,
        description=(f"vocabulary {VOCAB_LM:,} (SmolLM2's), {LM_POSITIONS} positions whose drafter keeps raw mass "
                     f"{kept} at top_k={LM_TOP_K} (measured; upstream #47932: {upstream}); the first positions "
                     f"walk the quantiles from the median"),
    )


class ScenarioRegistry(Mapping):
    """Scenarios by name; a costly one is built on first use (then kept: the same object every time)."""

    def __init__(self, scenarios: list[Scenario], builders: dict[str, Callable[[], Scenario]]):
        self._built = {s.name: s for s in scenarios}
        self._builders = dict(builders)
        self._order = [s.name for s in scenarios] + list(builders)

    def __getitem__(self, name: str) -> Scenario:
        if name not in self._built:
            if name not in self._builders:
                raise KeyError(name)
            self._built[name] = self._builders[name]()
        return self._built[name]

    def built(self, name: str) -> Scenario | None:
        """The scenario if it is registered and already built (no building)."""
        return self._built.get(name)

    def __iter__(self):
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)


def _registered(name: str) -> Scenario:
    return SCENARIOS[name]


# --- Targets that keep their history in state (generate and greedy modes) ---------------------------

#: The prompt of the stateful scenarios: ``markov8``'s twice, so that prompt lookup finds an earlier match
#: for each of its tokens and drafts ``gamma`` tokens, while five tokens stay unused (``no_repeat_ngram_size=1``
#: bans every token of the prompt: plain sampling must keep one for each of the 4 new tokens). Measured on
#: 5.25.0 (150 calls of 4 sampled tokens each, ``linear`` target): prompt lookup meets a rollback that
#: leaves a wrong state in 150 calls, the assistant model in 81; with ``markov8``'s own prompt, in 14 and
#: 111 of 200.
STATEFUL_PROMPT = (3, 1, 4, 3, 1, 4)
_TARGET_KIND_TEXT = {
    "linear": "one linear-attention layer (conv and recurrent state, as Mamba)",
    "hybrid": "a linear-attention and a full-attention layer (as Qwen3-Next, Jamba)",
    "sliding": "a sliding-window layer (window 3) and a full-attention layer (as Mistral, Gemma)",
    "static": "a full-attention layer in a StaticCache (cache_implementation='static')",
    "linear-full": "one layer holding a linear-attention state and attention keys (as Falcon-H1)",
    "linear-sliding": "one layer holding a linear-attention state and a sliding window of keys (window 3)",
    "indexed": "a sparse-attention layer with an indexer key cache (as DeepSeek V3.2)",
    "static-indexed": "a sparse-attention layer with an indexer key cache, in a StaticCache",
}
#: ``markov8``'s tables with targets that keep their history in the caches the loop rolls back
#: (:mod:`.stateful`): one scenario per target kind, ``markov8-linear`` ... ``markov8-static-indexed``.
STATEFUL = {kind: Scenario(
    name=f"markov8-{kind}",
    target=DEFAULT.target,
    drafter=DEFAULT.drafter,
    prompt=STATEFUL_PROMPT,
    gamma=DEFAULT.gamma,
    target_kind=kind,
    description=f"markov8's tables and its prompt twice, a target with {_TARGET_KIND_TEXT[kind]} (generate and "
                f"greedy modes)",
) for kind in TARGET_KIND_NAMES}

SCENARIOS = ScenarioRegistry(
    [DEFAULT, IID, FAST_TOKENIZERS, ID_ORDERED_VOCAB, BPE_FAST_TOKENIZERS, BPE_ID_ORDERED_VOCAB, LARGE_VOCAB,
     MARKOV_BF16, LARGE_VOCAB_BF16, LARGE_VOCAB_FP16, PADDED_DRAFTER, *STATEFUL.values()],
    {"lm49k": _lm49k},
)
