"""Hypothesis strategies for property-based fuzzing of warper stacks and fixed logits.

- :func:`warper_stacks`: ``GenerationConfig`` keyword arguments for a random subset of the warper
  catalog, each option with a parameter from its valid range. One presence flag per option is drawn
  first, so hypothesis shrinks a failing stack towards fewer warpers (then towards simpler values).
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


def _parameters(vocab_size: int) -> dict[str, st.SearchStrategy]:
    """Each option's raw parameter strategy. No constraint depends on which other options are drawn,
    so dropping a warper leaves every other choice valid and where it was (shrinking relies on it)."""
    token = st.integers(0, vocab_size - 1)
    sequence = st.lists(token, min_size=1, max_size=2)
    return {
        "temperature": st.floats(0.3, 2.0),
        "top_k": st.integers(1, vocab_size),
        "top_p": st.floats(0.2, 1.0, exclude_min=True),
        "min_p": st.floats(0.0, 1.0),
        "typical_p": st.floats(0.2, 1.0, exclude_min=True),
        "epsilon_cutoff": st.floats(0.0, 0.5, exclude_min=True),
        "eta_cutoff": st.floats(0.0, 0.5, exclude_min=True),
        "top_h": st.floats(0.05, 1.0),
        "repetition_penalty": st.floats(0.5, 3.0),
        "no_repeat_ngram_size": st.integers(1, 4),
        "bad_words_ids": st.lists(sequence, min_size=1, max_size=3, unique_by=tuple),
        "sequence_bias": st.lists(st.tuples(sequence, st.floats(-3.0, 3.0)), min_size=1, max_size=3,
                                  unique_by=lambda pair: tuple(pair[0])),
        "suppress_tokens": st.lists(token, min_size=1, max_size=3, unique=True),
        "min_new_tokens": st.integers(1, 4),
        "exponential_decay_length_penalty": st.tuples(st.integers(0, 4), st.floats(0.5, 3.0)),
    }


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
    if name == "sequence_bias":
        return [[tokens, bias] for tokens, bias in value], 0
    return value, 0


#: Every option :func:`warper_stacks` knows how to parametrise, in catalog order.
OPTIONS: tuple[str, ...] = tuple(_parameters(DEFAULT.vocab_size))


def warper_stacks(vocab_size: int = DEFAULT.vocab_size, *, history: int = HISTORY, max_banned: int | None = None,
                  eos_token_id: int = EOS, options: Iterable[str] | None = None,
                  presence_odds: int = 1) -> st.SearchStrategy[dict[str, Any]]:
    """Random warper stacks: ``GenerationConfig`` kwargs dicts (``{}`` is plain sampling).

    ``options`` defaults to the catalog options the installed ``GenerationConfig`` has
    (:func:`~lossless_check.laws.matrix.available_catalog`). Token ids lie in ``[0, vocab_size)``;
    ``min_new_tokens`` and ``exponential_decay_length_penalty`` come with ``eos_token_id``. The
    banning options mask at most ``max_banned`` tokens of any row (default ``vocab_size - 1``)
    after a history of up to ``history`` tokens (prompt plus generated). Each option is present with
    probability ``presence_odds / (presence_odds + 1)`` (default 1/2); absence is the simpler choice
    either way, so shrinking drops warpers.
    """
    names = tuple(e.option for e in available_catalog()) if options is None else tuple(options)
    unknown = [n for n in names if n not in OPTIONS]
    if unknown:
        raise ValueError(f"warper_stacks cannot parametrise {unknown}; known: {OPTIONS}")
    budget = vocab_size - 1 if max_banned is None else max_banned
    if budget < sum(n in names for n in EXPLICIT_BANS):
        raise ValueError(f"max_banned={budget} is too small for the banning options among {names}")

    parameters = _parameters(vocab_size)
    # An integer in [0, odds] shrinks towards 0, absent; 1 keeps the plain coin of earlier versions.
    flag = st.booleans() if presence_odds == 1 else st.integers(0, presence_odds).map(bool)

    @st.composite
    def stacks(draw) -> dict[str, Any]:
        # Presence flags first, then every option's parameter whether present or not: each choice
        # keeps its place and its constraints, so the shrinker can drop a warper by clearing its flag.
        # Flags go in reverse catalog order: of several one-warper failures the shrinker reports the
        # one whose flag comes last, i.e. the earliest catalog entry (temperature, top_k, ...).
        chosen = {name for name in reversed(names) if draw(flag)}
        # Each explicit banning option bans at least one token: reserve that before sizing the others.
        left = budget - sum(n in chosen for n in EXPLICIT_BANS)
        stack: dict[str, Any] = {}
        for name in (n for n in OPTIONS if n in names):
            value = draw(parameters[name])
            if name in chosen:
                stack[name], bans = _fit(name, value, history, left)
                left -= bans
                if name in ("min_new_tokens", "exponential_decay_length_penalty"):
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
