"""A strength-3 covering of the warper catalog: stacks in which every triple of options meets, informatively.

A generator wrong only when three particular options are stacked passes every pairwise matrix, and a
random search finds it only if some stack holds all three *and* leaves the laws they act on room to show
a wrong q: several truncations together leave ``markov8`` a point mass wherever a round reaches, and
there a wrong q changes nothing (a random stack of 8 to 13 of the 15 options is usually such a stack).
So the fuzzer checks, before any random search, the stacks of :func:`triple_covering`: each at most
:data:`MAX_OPTIONS` options, each option at its catalog ``stacked`` value (the milder truncation the
pairwise matrix stacks), and each **q-informative** on the scenario
(:func:`~.informativeness.q_informative_positions`: at a prefix a round reaches through accepted drafts,
the processed target and the processed drafter law both keep two tokens or more), at the first draft
position (which every trial reaches) where the triple allows it. Every triple of options that some
q-informative stack can hold is held by one of them.

Construction (deterministic, greedy): take the first triple no stack covers yet (catalog order); if it is
not q-informative alone at the stacked values, try the options' solo values, else record it as not
coverable on this scenario (``uncovered``, with why); grow it one option at a time, each time the option
that covers the most uncovered triples and keeps the stack q-informative, up to :data:`MAX_OPTIONS`.
Each triple is covered :data:`TIMES` times, each time beside options it has not stood beside before. On
``markov8`` with the 15 options of 5.24: 50 stacks (:data:`MAX_OPTIONS`), each triple in 2 to 7 of them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from lossless_check.core.errors import PlainSamplingFails

#: Most options in one covering stack. Measured on markov8 (5.24, 15 options, 455 triples, q-informative at
#: position 1 where the triple can be), each once: at 7, 27 stacks cover all 455 triples (126 law computations,
#: 2.6 s); at 6, 40 stacks; at 5, 65. Twice (:data:`TIMES`), at 7: 50 stacks (257 law computations). Fewer, larger stacks cost fewer checks; their laws are narrower (2 to 4
#: tokens at position 1 at 7 options), which provenance sees exactly and the statistical pass with less power.
MAX_OPTIONS = 7
#: Stacks each triple is held by, with different options beside it. The laws a generator samples from can be
#: narrower than the scenario's processed drafter law (measured: the built-in Assisted's assistant applies
#: the warpers its own generate() builds beside the ones it is handed, and at the covering's only stack for
#: temperature, top_k and repetition_penalty drafted from a point mass), so one stack per triple can miss.
TIMES = 2


@dataclass
class Covering:
    """The stacks of a covering, in the order they are checked, and what they cover."""

    stacks: list[dict[str, Any]]
    options: list[str]
    #: Triples no q-informative stack can hold on this scenario, each with why (plain sampling fails, or
    #: the laws keep one token).
    uncovered: dict[tuple[str, str, str], str] = field(default_factory=dict)

    @property
    def triples(self) -> int:
        """Triples of the options, all of them."""
        n = len(self.options)
        return n * (n - 1) * (n - 2) // 6


def triples_of(stack: dict[str, Any], options: list[str]) -> set[tuple[str, str, str]]:
    """The option triples a stack holds (in ``options`` order)."""
    present = [o for o in options if o in stack]
    return set(itertools.combinations(present, 3))


def q_informative(scenario, stack: dict[str, Any], first: bool = False) -> bool | None:
    """Whether a stack is q-informative on ``scenario`` (at position 1, the first draft, which every trial
    reaches, with ``first``); ``None``: plain sampling fails under it."""
    from lossless_check.modes.informativeness import q_informative_positions

    try:
        positions = q_informative_positions(scenario, stack)
    except PlainSamplingFails:
        return None
    return 1 in positions if first else bool(positions)


def _merged(entries) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for entry in entries:
        merged.update(entry)
    return merged


def triple_covering(scenario, entries, max_options: int = MAX_OPTIONS, times: int = TIMES) -> Covering:
    """The covering of the module docstring for catalog ``entries``
    (:class:`~lossless_check.laws.matrix.WarperEntry`) on ``scenario``: every triple in ``times`` stacks
    whose other options differ."""
    options = [e.option for e in entries]
    stacked = {e.option: dict(e.stacked_kwargs) for e in entries}
    solo = {e.option: dict(e.kwargs) for e in entries}
    need = {t: times for t in itertools.combinations(options, 3)}
    # The options that have stood beside each triple in a stack: the next stack of the triple leaves them out.
    beside: dict[tuple, set[str]] = {t: set() for t in need}
    cache: dict[tuple[str, bool], bool | None] = {}

    def informative(values: dict[str, dict], first: bool) -> bool | None:
        stack = _merged(values[o] for o in options if o in values)
        key = (repr(sorted(stack.items(), key=lambda kv: kv[0])), first)
        if key not in cache:
            cache[key] = q_informative(scenario, stack, first)
        return cache[key]

    covering = Covering([], options)
    while any(need.values()):
        triple = min((t for t, n in need.items() if n), key=lambda t: [options.index(o) for o in t])
        # The first draft if it can (every trial's evidence), else any draft position; stacked values first.
        tries = [(first, kind) for first in (True, False) for kind in (stacked, solo)]
        found = next((({o: kind[o] for o in triple}, first) for first, kind in tries
                      if informative({o: kind[o] for o in triple}, first)), None)
        if found is None:
            never, need[triple] = need[triple] == times, 0
            if never:
                fails = all(informative({o: kind[o] for o in triple}, False) is None for kind in (stacked, solo))
                covering.uncovered[triple] = ("plain sampling fails under these three options" if fails else
                                              "the processed target or drafter is a point mass wherever a round "
                                              "reaches, at the stacked and the solo values")
            continue
        values, first = found
        while len(values) < max_options:
            gains = []
            for option in options:
                if option in values or option in beside[triple]:
                    continue
                members = [o for o in options if o in values or o == option]
                gain = sum(need[t] > 0 for t in itertools.combinations(members, 3) if option in t)
                if gain:
                    gains.append((-gain, options.index(option), option))
            for _, _, option in sorted(gains):
                if informative({**values, option: stacked[option]}, first):
                    values[option] = stacked[option]
                    break
            else:
                break
        stack = _merged(values[o] for o in options if o in values)
        if stack in covering.stacks:  # nothing new beside this triple: it has all the stacks it can get
            need[triple] = 0
            continue
        covering.stacks.append(stack)
        for t in triples_of(stack, options):
            need[t] = max(0, need[t] - 1)
            beside[t] |= set(values) - set(t)
    return covering
