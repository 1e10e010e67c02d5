"""Hypothesis strategies for property-based fuzzing of warper stacks and fixed logits.

- :func:`warper_stacks`: ``GenerationConfig`` keyword arguments for a random subset of the warper
  catalog, each option with a parameter from its valid range. Presence coins per option are drawn
  first, so hypothesis shrinks a failing stack towards fewer warpers (then towards simpler values).
  Every choice is a fair coin: what a seed draws does not depend on the modules imported (hypothesis's
  local constants reach integer, float and string draws only).
- :func:`informative_stacks`: a stack strategy kept to the stacks that are not vacuous on a scenario
  (:mod:`~lossless_check.modes.informativeness`): a vacuous stack cannot fail on ``q``, so a property "every
  drawn stack is lossless" would pass there without testing anything (the harness reports it
  ``vacuous``, not ``lossless``).
- :func:`logits_vectors`, :func:`logits_tables`, :func:`scenarios`: finite logits, optionally with
  some ``-inf`` entries but never a row of them, as vectors, :class:`~lossless_check.laws.tables.FixedLogits`
  tables, or whole step-mode :class:`~lossless_check.laws.scenarios.Scenario` objects.

Banning processors (``no_repeat_ngram_size``, ``bad_words_ids``, ``suppress_tokens``, and
``min_new_tokens``, which bans EOS) could together mask every token of a row, a configuration
``generate()`` itself cannot sample from. :func:`warper_stacks` keeps their worst-case number of
banned tokens per row within ``max_banned``, so every drawn stack is usable on any table with at
most ``vocab_size - 1 - max_banned`` ``-inf`` entries per row and histories of up to ``history``
tokens.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
from hypothesis import strategies as st

from lossless_check.laws.matrix import EOS, available_catalog
from lossless_check.laws.scenarios import DEFAULT, Scenario
from lossless_check.laws.tables import FixedLogits

#: Options that come with a catalog entry but are not warpers themselves (the EOS they act on).
AUXILIARY = ("eos_token_id",)
#: The options that come with ``eos_token_id``.
EOS_OPTIONS = ("min_new_tokens", "exponential_decay_length_penalty")
#: Default history length: the step-mode scenarios' prompt plus the tokens drafted in a round.
HISTORY = len(DEFAULT.prompt) + DEFAULT.gamma
#: Options that mask given tokens outright (``min_new_tokens`` masks EOS); ``no_repeat_ngram_size``
#: masks tokens of the history.
EXPLICIT_BANS = ("bad_words_ids", "suppress_tokens", "min_new_tokens")


def stack_options(stack: dict[str, Any]) -> list[str]:
    """The warper options of a stack (``min_new_tokens`` and its ``eos_token_id`` are one warper)."""
    return [key for key in stack if key not in AUXILIARY]


def _ngram_bans(n: int, history: int) -> int:
    """Tokens ``no_repeat_ngram_size=n`` can ban in one row at most: one per earlier n-gram start."""
    return max(0, history - n + 1)


# Every choice a stack is drawn from is a fair coin (``st.booleans()``). Hypothesis injects literals
# found in the local modules it sees in ``sys.modules`` into its integer, float, bytes and string draws
# (its "local constants"), so with any of those the same seed explored different stacks depending on
# what else was imported (a fresh interpreter and a fully imported one parted at the 7th example); a
# coin draws no constant. Numbers are read from coins, most significant first, so shrinking (coins
# towards False) moves every value towards index 0 of its grid.


def _bits(draw, count: int) -> int:
    """An integer in ``[0, 2**count)`` from ``count`` coins."""
    value = 0
    for _ in range(count):
        value = 2 * value + int(draw(st.booleans()))
    return value


def _index(draw, size: int) -> int:
    """An integer in ``[0, size)`` from coins (0 the simplest)."""
    return _bits(draw, max(1, (size - 1).bit_length())) % size


def _grid(first: float, low: float, high: float, points: int = 31) -> tuple[float, ...]:
    """``first`` (the catalog's stacked value: where shrinking goes), then ``points`` values from
    ``low`` to ``high``, rounded to 3 digits."""
    step = (high - low) / (points - 1)
    return (first, *(round(low + i * step, 3) for i in range(points)))


def _parameters(vocab_size: int) -> dict[str, Any]:
    """Each option's parameter, drawn from coins (``draw -> value``); any coins give a valid value, and
    no constraint depends on which other options are drawn. Ranges: temperature 0.3-2, top_k 1-V, top_p
    0.2-1, min_p 0-1, typical_p 0.2-1, epsilon and eta 0.005-0.5, top_h 0.05-1, repetition_penalty 0.5-3,
    no_repeat_ngram_size 1-4, 1-3 bad words or biased sequences of 1-2 tokens (bias -3 to 3), 1-3
    suppressed tokens, min_new_tokens 1-4, exponential decay from token 0-4 at a factor 0.5-3."""
    grids = {
        "temperature": _grid(0.8, 0.3, 2.0), "top_p": _grid(0.9, 0.2, 1.0), "min_p": _grid(0.05, 0.0, 1.0),
        "typical_p": _grid(0.9, 0.2, 1.0), "epsilon_cutoff": _grid(0.02, 0.005, 0.5),
        "eta_cutoff": _grid(0.02, 0.005, 0.5), "top_h": _grid(0.8, 0.05, 1.0),
        "repetition_penalty": _grid(2.0, 0.5, 3.0),
    }

    def value(grid):
        return lambda draw: grid[_index(draw, len(grid))]

    def token(draw) -> int:
        return _index(draw, vocab_size)

    def some(element, most: int = 3):
        """1 to ``most`` elements: the first always, each further one on a coin."""
        def draw_list(draw):
            items = [element(draw)]
            while len(items) < most and draw(st.booleans()):
                items.append(element(draw))
            return items
        return draw_list

    def sequence(draw) -> list[int]:
        return some(token, 2)(draw)

    def unique(items: list) -> list:
        seen, kept = set(), []
        for item in items:
            key = tuple(item) if isinstance(item, list) else item
            if key not in seen:
                seen.add(key)
                kept.append(item)
        return kept

    bias = _grid(2.0, -3.0, 3.0)
    return {
        "temperature": value(grids["temperature"]),
        "top_k": lambda draw: (5, *range(1, vocab_size + 1))[_index(draw, vocab_size + 1)],
        "top_p": value(grids["top_p"]),
        "min_p": value(grids["min_p"]),
        "typical_p": value(grids["typical_p"]),
        "epsilon_cutoff": value(grids["epsilon_cutoff"]),
        "eta_cutoff": value(grids["eta_cutoff"]),
        "top_h": value(grids["top_h"]),
        "repetition_penalty": value(grids["repetition_penalty"]),
        "no_repeat_ngram_size": lambda draw: 1 + _bits(draw, 2),
        "bad_words_ids": lambda draw: unique(some(sequence)(draw)),
        "sequence_bias": lambda draw: [list(pair) for pair in _unique_sequences(
            some(lambda d: (sequence(d), bias[_index(d, len(bias))]))(draw))],
        "suppress_tokens": lambda draw: unique(some(token)(draw)),
        "min_new_tokens": lambda draw: 1 + _bits(draw, 2),
        "exponential_decay_length_penalty": lambda draw: (_index(draw, 5), value(_grid(2.0, 0.5, 3.0))(draw)),
    }


def _unique_sequences(pairs: list) -> list:
    """``(sequence, bias)`` pairs, the first of each sequence kept."""
    seen, kept = set(), []
    for tokens, value in pairs:
        if tuple(tokens) not in seen:
            seen.add(tuple(tokens))
            kept.append((tokens, value))
    return kept


def _fit(name: str, value: Any, history: int, left: int) -> tuple[Any, int]:
    """``value`` cut down to the free ban budget ``left``, and the tokens it bans beyond its first.

    The first token of each explicit ban is reserved beforehand: ``bad_words_ids`` and
    ``suppress_tokens`` keep at most ``1 + left`` entries (a bad word bans one token, its last, after
    its prefix), and ``no_repeat_ngram_size`` grows until it bans at most ``left`` tokens.
    """
    if name == "no_repeat_ngram_size":
        n = max(value, next(n for n in range(1, history + 2) if _ngram_bans(n, history) <= left))
        return n, _ngram_bans(n, history)
    if name in ("bad_words_ids", "suppress_tokens"):
        kept = value[: 1 + left]
        return kept, len(kept) - 1
    return value, 0


#: Every option :func:`warper_stacks` knows how to parametrise, in catalog order.
OPTIONS: tuple[str, ...] = tuple(_parameters(DEFAULT.vocab_size))


def warper_stacks(vocab_size: int = DEFAULT.vocab_size, *, history: int = HISTORY, max_banned: int | None = None,
                  eos_token_id: int = EOS, options: Iterable[str] | None = None,
                  presence_bits: int = 1) -> st.SearchStrategy[dict[str, Any]]:
    """Random warper stacks: ``GenerationConfig`` kwargs dicts (``{}`` is plain sampling).

    ``options`` defaults to the catalog options the installed ``GenerationConfig`` has
    (:func:`~lossless_check.laws.matrix.available_catalog`). Token ids lie in ``[0, vocab_size)``;
    ``min_new_tokens`` and ``exponential_decay_length_penalty`` come with ``eos_token_id``. The
    banning options mask at most ``max_banned`` tokens of any row (default ``vocab_size - 1``)
    after a history of up to ``history`` tokens (prompt plus generated). Each option is present when
    ``presence_bits`` coins all come up heads: probability ``2 ** -presence_bits`` (default 1/2; the fuzzer
    draws sparse stacks at 1/4); absence is the simpler choice either way, so shrinking drops warpers.

    Every choice is a fair coin, so what a seed draws does not depend on which other modules are
    imported (Hypothesis's local-constants provider injects literals of local modules into integer,
    float and string draws, never into booleans).
    """
    names = tuple(e.option for e in available_catalog()) if options is None else tuple(options)
    unknown = [n for n in names if n not in OPTIONS]
    if unknown:
        raise ValueError(f"warper_stacks cannot parametrise {unknown}; known: {OPTIONS}")
    if presence_bits < 1:
        raise ValueError(f"presence_bits must be at least 1, got {presence_bits}")
    budget = vocab_size - 1 if max_banned is None else max_banned
    if budget < sum(n in names for n in EXPLICIT_BANS):
        raise ValueError(f"max_banned={budget} is too small for the banning options among {names}")

    parameters = _parameters(vocab_size)

    @st.composite
    def stacks(draw) -> dict[str, Any]:
        # Presence first, then the parameters of the options present, in catalog order: two choice
        # sequences give two different stacks (an absent option draws nothing), so a search's examples are
        # distinct stacks, and the shrinker drops a warper by clearing one of its coins (every coin
        # sequence is valid, so the parameters after it stay valid). Presence goes in reverse catalog
        # order: of several one-warper failures the shrinker reports the one whose coins come last, i.e.
        # the earliest catalog entry (temperature, top_k, ...).
        chosen = {name for name in reversed(names) if all([draw(st.booleans()) for _ in range(presence_bits)])}
        # Each explicit banning option bans at least one token: reserve that before sizing the others.
        left = budget - sum(n in chosen for n in EXPLICIT_BANS)
        stack: dict[str, Any] = {}
        for name in (n for n in OPTIONS if n in chosen):
            stack[name], bans = _fit(name, parameters[name](draw), history, left)
            left -= bans
            if name in EOS_OPTIONS:
                stack["eos_token_id"] = eos_token_id
        return stack

    return stacks()


def informative_stacks(stacks: st.SearchStrategy[dict[str, Any]] | None = None,
                       scenario: Scenario = DEFAULT) -> st.SearchStrategy[dict[str, Any]]:
    """``stacks`` (default :func:`warper_stacks`) without the stacks vacuous on ``scenario``: kept are
    those whose processed target is not a point mass at some prefix a step-mode round drafting from the
    scenario's drafter reaches (exact, from the laws:
    :func:`~lossless_check.modes.informativeness.reference_informative_positions`)."""
    from lossless_check.modes.informativeness import reference_informative_positions

    return (warper_stacks(scenario.vocab_size) if stacks is None else stacks).filter(
        lambda stack: bool(reference_informative_positions(scenario, stack)))


def logits_vectors(vocab_size: int = DEFAULT.vocab_size, *, max_masked: int | None = None,
                   scale: float = 8.0) -> st.SearchStrategy[np.ndarray]:
    """Float64 logits in ``[-scale, scale]`` with up to ``max_masked`` entries ``-inf`` (never all).

    ``max_masked`` defaults to ``vocab_size - 1``; ``0`` gives finite vectors only.
    """
    most = vocab_size - 1 if max_masked is None else min(max_masked, vocab_size - 1)
    values = st.lists(st.floats(-scale, scale), min_size=vocab_size, max_size=vocab_size)
    masked = st.sets(st.integers(0, vocab_size - 1), max_size=most)

    def build(pair) -> np.ndarray:
        vector = np.array(pair[0], dtype=np.float64)
        vector[sorted(pair[1])] = -np.inf
        return vector

    return st.tuples(values, masked).map(build)


def logits_tables(kind: str, vocab_size: int = DEFAULT.vocab_size, *, rows: int | None = None,
                  max_masked: int | None = None, scale: float = 8.0) -> st.SearchStrategy[FixedLogits]:
    """:class:`~lossless_check.laws.tables.FixedLogits` of ``kind`` (``iid``, ``per_position`` or ``markov``).

    ``rows``: the number of rows of a ``per_position`` table (default: 1 to 4, drawn). ``iid`` has
    one row and ``markov`` one per token. Rows come from :func:`logits_vectors`.
    """
    vector = logits_vectors(vocab_size, max_masked=max_masked, scale=scale)
    if kind == "iid":
        count = st.just(1)
    elif kind == "markov":
        count = st.just(vocab_size)
    elif kind == "per_position":
        count = st.just(rows) if rows is not None else st.integers(1, 4)
    else:
        raise ValueError(f"table kind must be iid, per_position or markov, got {kind!r}")
    return count.flatmap(lambda n: st.lists(vector, min_size=n, max_size=n)).map(
        lambda table: FixedLogits(kind, np.stack(table)))


def scenarios(vocab_size: int = DEFAULT.vocab_size, *, target_kind: str = "markov", drafter_kind: str = "per_position",
              target_masked: int = 0, drafter_masked: int = 0,
              gamma: int = DEFAULT.gamma) -> st.SearchStrategy[Scenario]:
    """Step-mode scenarios with random target and drafter tables and the default prompt (mod ``vocab_size``).

    ``target_masked`` / ``drafter_masked`` bound the ``-inf`` entries per row of each table: with
    :func:`warper_stacks`, keep ``max_masked + max_banned < vocab_size`` so that no processed row is
    masked everywhere.
    """
    prompt = tuple(t % vocab_size for t in DEFAULT.prompt)
    return st.builds(
        lambda target, drafter: Scenario("fuzz", target, drafter, prompt, gamma),
        logits_tables(target_kind, vocab_size, max_masked=target_masked),
        logits_tables(drafter_kind, vocab_size, max_masked=drafter_masked),
    )
