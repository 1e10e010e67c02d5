"""The warper catalog and the matrices of a run: generators x warper stacks.

Each catalog entry is one sampling-relevant ``GenerationConfig`` option with a value that changes
the target law of the default scenarios (a value that changes nothing tests nothing; the test suite
asserts each one bites). History-dependent entries need drafted positions and a Markov target to
mean anything: they are marked, and the default scenario (``markov8``) exercises them.

In stacks an entry uses its ``stacked`` value: a truncation milder than its value alone (which still
bites alone; tested), because several strong truncations together leave ``markov8`` a point mass at
every prefix a round reaches, and such a stack is vacuous (:mod:`.informativeness`): with the solo
values, 8 of the 105 pairs are vacuous even as a pair. With the stacked values every stack of the
``default`` and ``full`` matrices is informative for a drafter of the scenario, so every pair of
options is tested by a stack that can reveal a bug (the test suite computes it from the exact laws).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

#: Token used as end-of-sequence by the entries that need one (min_new_tokens, length penalty).
EOS = 5


@dataclass(frozen=True)
class WarperEntry:
    """One catalog entry: the option it is about and the kwargs that make it bite."""

    option: str
    kwargs: dict[str, Any]
    history_dependent: bool = False
    #: The kwargs the entry takes in stacks (default: ``kwargs``).
    stacked: dict[str, Any] | None = None

    @property
    def stacked_kwargs(self) -> dict[str, Any]:
        return self.kwargs if self.stacked is None else self.stacked


CATALOG: tuple[WarperEntry, ...] = (
    WarperEntry("temperature", {"temperature": 0.6}, stacked={"temperature": 0.8}),
    WarperEntry("top_k", {"top_k": 3}, stacked={"top_k": 5}),
    WarperEntry("top_p", {"top_p": 0.7}, stacked={"top_p": 0.9}),
    WarperEntry("min_p", {"min_p": 0.15}, stacked={"min_p": 0.05}),
    WarperEntry("typical_p", {"typical_p": 0.6}, stacked={"typical_p": 0.9}),
    WarperEntry("epsilon_cutoff", {"epsilon_cutoff": 0.06}, stacked={"epsilon_cutoff": 0.02}),
    WarperEntry("eta_cutoff", {"eta_cutoff": 0.06}, stacked={"eta_cutoff": 0.02}),
    WarperEntry("top_h", {"top_h": 0.5}, stacked={"top_h": 0.8}),
    WarperEntry("repetition_penalty", {"repetition_penalty": 2.0}, history_dependent=True),
    WarperEntry("no_repeat_ngram_size", {"no_repeat_ngram_size": 1}, history_dependent=True),
    WarperEntry("bad_words_ids", {"bad_words_ids": [[2], [4, 1]]}, history_dependent=True),
    WarperEntry("sequence_bias", {"sequence_bias": [[[1], 2.0], [[4, 2], -3.0]]}, history_dependent=True),
    WarperEntry("suppress_tokens", {"suppress_tokens": [4]}),
    WarperEntry("min_new_tokens", {"min_new_tokens": 2, "eos_token_id": EOS}, history_dependent=True),
    WarperEntry(
        "exponential_decay_length_penalty",
        {"exponential_decay_length_penalty": (1, 2.0), "eos_token_id": EOS},
        history_dependent=True,
    ),
)

#: The warpers most users combine; the ``full`` matrix is their power set.
MAIN_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty")


def available_catalog() -> list[WarperEntry]:
    """Catalog entries whose option exists in the installed ``GenerationConfig``."""
    from transformers import GenerationConfig

    known = GenerationConfig().to_dict()
    return [e for e in CATALOG if e.option in known]


def _merge(entries) -> dict[str, Any]:
    """One stack of several entries, each at its ``stacked`` value."""
    merged: dict[str, Any] = {}
    for entry in entries:
        merged.update(entry.stacked_kwargs)
    return merged


#: GF(4) multiplication (elements 0, 1, a, a + 1 as 0-3; addition is XOR).
_GF4_MUL = ((0, 0, 0, 0), (0, 1, 2, 3), (0, 2, 3, 1), (0, 3, 1, 2))
#: Lines of the affine plane over GF(4), as points ``4x + y``: 20 lines of 4 points, every pair of its 16
#: points on exactly one line.
_PLANE_LINES = tuple([tuple(4 * x + (_GF4_MUL[m][x] ^ b) for x in range(4)) for m in range(4) for b in range(4)]
                     + [tuple(4 * c + y for y in range(4)) for c in range(4)])
#: The point of each catalog option, chosen by a seeded search over placements: every line's stack is
#: informative at 3 or 4 of markov8's 4 positions (``tests/test_matrix.py`` checks it from the exact laws),
#: and the one line holding both ``exponential_decay_length_penalty`` and ``no_repeat_ngram_size`` (plain
#: sampling fails under the two on 4.37-5.18 wherever the second masks EOS:
#: ``fixtures/releases.py``) holds one other option only, so that at most 3 pairs are untestable there.
PLANE_POINTS = {
    "temperature": 15, "top_k": 1, "top_p": 2, "min_p": 6, "typical_p": 5, "epsilon_cutoff": 11, "eta_cutoff": 7,
    "top_h": 14, "repetition_penalty": 13, "no_repeat_ngram_size": 9, "bad_words_ids": 10, "sequence_bias": 4,
    "suppress_tokens": 0, "min_new_tokens": 8, "exponential_decay_length_penalty": 3,
}


def pairwise_stacks(entries: list[WarperEntry]) -> list[dict[str, Any]]:
    """Stacks in which every pair of entries appears together exactly once: the lines of the affine plane
    over GF(4), each entry on its :data:`PLANE_POINTS` point, a line's entries at their ``stacked`` values.

    20 stacks of at most four entries for the 15 of the catalog (a greedy covering took 29); a release
    without some options has their points empty, and lines left with fewer than two entries are dropped.
    """
    at = {PLANE_POINTS[e.option]: e for e in entries}
    stacks = []
    for line in _PLANE_LINES:
        members = [at[point] for point in sorted(line) if point in at]
        if len(members) >= 2:
            stacks.append(_merge(sorted(members, key=entries.index)))
    return stacks


def matrix(name: str) -> list[dict[str, Any]]:
    """Warper stacks of a named matrix.

    - ``smoke``: plain sampling, top-k, temperature;
    - ``default``: plain sampling, every catalog entry alone, and stacks covering every pair (of up to
      four entries at their ``stacked`` values);
    - ``full``: ``default`` plus the whole power set of the main warpers (``stacked`` values).
    """
    entries = available_catalog()
    by_option = {e.option: e for e in entries}
    if name == "smoke":
        return [{}, by_option["top_k"].kwargs, by_option["temperature"].kwargs]
    default = [{}] + [dict(e.kwargs) for e in entries] + pairwise_stacks(entries)
    if name == "default":
        return default
    if name == "full":
        main = [by_option[o] for o in MAIN_OPTIONS if o in by_option]
        power_set = [
            _merge(combo) for size in range(2, len(main) + 1) for combo in itertools.combinations(main, size)
        ]
        return default + [s for s in power_set if s not in default]
    raise KeyError(name)


MATRIX_NAMES = ("smoke", "default", "full")

#: Real-world cases the ``default`` and ``full`` matrices add for every generator, beside their stacks
#: on the default scenario: ``(scenario, stack)``. A real vocabulary under ``top_k=50``, a large vocabulary under nucleus sampling (where
#: raw-logits and tail bugs live; each case costs about 60-80 s of one core at 5,000 trials, as the
#: drafter's real top-p sorts 32,000 logits per token) and real fast tokenizers (Universal's hash-order
#: bug). Step-side modes only: generate mode runs them through :func:`lossless_check.check` or
#: ``--scenario``.
REAL_WORLD_SLICES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("zipf32k", {"top_p": 0.9}),
    ("iid32-fast-tokenizers", {}),
    # A real vocabulary at real effect sizes: generate()'s default top_k on SmolLM2-like laws, where
    # the raw-logits bug moves the output by upstream's TVs (#47932).
    ("lm49k", {"top_k": 50}),
)


def real_world_slices(name: str) -> list[tuple[str, dict[str, Any]]]:
    """The :data:`REAL_WORLD_SLICES` a named matrix adds (none for ``smoke``)."""
    return [(scenario, dict(stack)) for scenario, stack in REAL_WORLD_SLICES] if name in ("default", "full") else []
