"""Which output positions of a case can carry evidence about ``q``: exact, from the exact laws.

**Criterion.** Let ``p(. | prefix)`` be the processed target law (:class:`~.expected.ExactLaws`) and
call a prefix *reachable* when plain sampling emits it with positive probability (every token has
``p > 0`` given the tokens before it; in generate mode nothing follows an EOS). Output position ``j``
is *informative* when some reachable prefix of ``j - 1`` tokens has a law that is not a point mass.
A case none of whose tested positions is informative is **vacuous**: no ``q`` can change its output law.

Why. Where ``p`` is a point mass on token ``t``, Algorithm 1 emits ``t`` whatever ``q`` is: a draft
``x != t`` has ``p(x) / q(x) = 0`` and is rejected (unless ``q(x) = 0``: an impossible draft, an exact
failure), a draft ``t`` has ``p(t) / q(t) >= 1`` and is accepted, and the residual
``normalize(max(p - q, 0))`` has all its mass on ``t``. So, by induction on positions, as long as
every law met is a point mass the emitted tokens are the one reachable sequence, for every ``q``: a
position test there compares a point mass with itself and cannot reject. Only the exact checks
(support, impossible drafts, stopping) can still fail, and they do run. How *many* tokens a round
emits does depend on ``q``, but the tests condition on reaching a position. Conversely, at a reachable
prefix whose law has two or more tokens some ``q`` changes the emitted law (a generator that always
drafts one of them but returns ``q = p``: every draft is accepted, the other tokens are never emitted).

A case is tested before it runs (this criterion, from the laws alone: a vacuous case gets no share
of the run's alpha) and after (:func:`~.analysis.position_tests`: the positions where its trials met a
law that is not a point mass). In step mode a trial reaches position ``j > 1`` only through ``j - 1``
accepted drafts, so a position informative by the laws may never be reached by a generator whose
drafts the target cannot accept there (acceptance 0 at position 1): such a run carries no evidence
either, and its verdict is ``vacuous`` too. :func:`reference_informative_positions` says which
positions a round whose drafts follow the scenario's processed drafter law reaches informatively
(what the matrix's coverage counts).

Unknown is never vacuous: past :data:`MAX_VISITED` prefixes the positions not yet shown informative
are counted informative (a vacuity claim must be proven). Greedy references (``do_sample=False``)
are point masses by design and their checks are exact: they get no informativeness (``None``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from lossless_check.core.errors import PlainSamplingFails

#: Prefixes the search may visit before it stops and counts the rest informative.
MAX_VISITED = 20_000


def informative_positions(law_of: Callable[[tuple], np.ndarray], positions: int,
                          stop_tokens: frozenset[int] = frozenset(),
                          drafter_of: Callable[[tuple], np.ndarray] | None = None,
                          budget: int = MAX_VISITED) -> list[int]:
    """The 1-based positions ``j <= positions`` at which a reachable prefix has a law that is not a point mass.

    Depth-first over reachable prefixes (children: the tokens of positive probability, none after a
    token of ``stop_tokens``; with ``drafter_of``, only tokens the drafter law also gives positive
    probability: prefixes of accepted drafts); a subtree is left out once every position it could
    inform is known informative, so a case informative everywhere costs about ``positions`` laws.
    Past ``budget`` visited prefixes, the positions not yet decided are counted informative.
    """
    found = [False] * positions
    stack: list[tuple[int, ...]] = [()]
    visited = 0
    while stack:
        prefix = stack.pop()
        depth = len(prefix)
        if all(found[depth:]):
            continue
        visited += 1
        if visited > budget:
            return list(range(1, positions + 1))
        law = law_of(prefix)
        support = np.flatnonzero(law > 0)
        found[depth] = found[depth] or len(support) > 1
        if depth + 1 < positions:
            if drafter_of is not None:
                support = support[drafter_of(prefix)[support] > 0]
            # Nothing is emitted after a stop token: such a prefix is no position's history.
            stack.extend(prefix + (int(t),) for t in support[::-1] if int(t) not in stop_tokens)
    return [j + 1 for j in range(positions) if found[j]]


def _step_laws(scenario, warpers: dict):
    """The exact laws of a step case's processed target and drafter (the processors it builds)."""
    import torch

    from lossless_check.laws.expected import ExactLaws
    from lossless_check.laws.stubs import fixed_logits_lm
    from lossless_check.laws.warpers import capture_processors
    from lossless_check.modes.step import STEP_MAX_NEW_TOKENS

    target = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
    processors, _ = capture_processors(target, torch.tensor([scenario.prompt], dtype=torch.long), warpers,
                                       STEP_MAX_NEW_TOKENS)
    return ExactLaws(scenario, processors)


def _generate_laws(case):
    """``(target law, stop tokens)`` of a generate case's reference: plain sampling with its config."""
    import torch

    from lossless_check.laws.expected import ExactLaws
    from lossless_check.laws.stubs import fixed_logits_lm
    from lossless_check.laws.warpers import capture_processors
    from lossless_check.modes.generate import TinyLlamaScenario, _ModelLaws, tiny_llama_pair

    scenario = case.scenario
    llama = isinstance(scenario, TinyLlamaScenario)
    target = (tiny_llama_pair(scenario.seed, scenario.vocab_size)[0] if llama
              else fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt)))
    processors, config = capture_processors(target, torch.tensor([scenario.prompt], dtype=torch.long),
                                            case.warpers, case.max_new_tokens)
    laws = _ModelLaws(target, scenario.prompt, processors) if llama else ExactLaws(scenario, processors)
    eos = config.eos_token_id
    return laws.target, frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)


#: :func:`case_informative_positions` per scenario, stack, mode and ``max_new_tokens``: scenarios hold
#: arrays (unhashable), so the key has the scenario's id and the value the scenario (an id is unique
#: only while its object lives).
_PLANNED: dict[tuple, tuple[object, tuple[int, ...]]] = {}


def case_informative_positions(case) -> list[int] | None:
    """:func:`informative_positions` of a case's tested positions, from the laws alone (``None``: no
    such claim applies). Cached per scenario, stack and mode: a matrix's generators share it.

    Step mode (and ``all``): positions ``1 .. gamma + 1`` of one round, under the processors the step
    case builds. Generate mode: the first ``max_new_tokens`` emitted tokens, nothing after an EOS of
    the generation config. ``None`` for provenance mode (exact, no law test) and for greedy references
    (:data:`~.modes.loop_models.GREEDY_FAMILIES`: point masses by design, their checks exact).
    """
    from lossless_check.modes.loop_models import GREEDY_FAMILIES

    generate = case.mode == "generate"
    if case.mode in ("provenance", "greedy") or (generate and case.generator.adapter.name in GREEDY_FAMILIES):
        return None
    key = (id(case.scenario), case.warper_spec, generate, case.max_new_tokens if generate else 0)
    if _PLANNED.get(key, (None,))[0] is not case.scenario:
        try:
            if generate:
                law, stop = _generate_laws(case)
                plan = tuple(informative_positions(law, case.max_new_tokens, stop))
            else:
                law = _step_laws(case.scenario, case.warpers).target
                plan = tuple(informative_positions(law, case.scenario.gamma + 1))
        except PlainSamplingFails:
            plan = None  # no claim: the case's own trials meet the failure and skip it with its reason
        _PLANNED[key] = case.scenario, plan
    plan = _PLANNED[key][1]
    return None if plan is None else list(plan)


def reference_informative_positions(scenario, warpers: dict) -> list[int]:
    """Step mode's informative positions when drafts follow the scenario's processed drafter law:
    what a round of a correct generator drafting from the scenario's drafter reaches (the matrix's
    coverage counts a stack that is informative here)."""
    laws = _step_laws(scenario, warpers)
    return informative_positions(laws.target, scenario.gamma + 1, drafter_of=laws.drafter)



def q_informative_positions(scenario, warpers: dict) -> list[int]:
    """The draft positions ``j <= gamma`` at which a prefix a step round reaches (through drafts the
    processed target and drafter both allow: accepted drafts) has a processed target law *and* a processed
    drafter law of two or more tokens each.

    Stronger than :func:`reference_informative_positions`: where the drafter's law is a point mass, a q of
    the wrong shape built from it (sharpened, flattened, its logits scaled) is the same point mass, and where
    the target's is, no q changes what is emitted. A stack with such a position lets a wrong q show for any
    of those shapes (what the fuzzer's covering of option triples asks of its stacks). Raises
    :class:`~lossless_check.core.errors.PlainSamplingFails` where plain sampling fails under the stack.
    """
    laws = _step_laws(scenario, warpers)
    found: set[int] = set()
    stack: list[tuple[int, ...]] = [()]
    visited = 0
    while stack and len(found) < scenario.gamma:
        prefix = stack.pop()
        visited += 1
        if visited > MAX_VISITED:  # unknown is informative (as informative_positions counts it)
            return list(range(1, scenario.gamma + 1))
        target, drafter = laws.target(prefix), laws.drafter(prefix)
        both = np.flatnonzero((target > 0) & (drafter > 0))
        if np.count_nonzero(target) > 1 and np.count_nonzero(drafter) > 1:
            found.add(len(prefix) + 1)
        if len(prefix) + 1 < scenario.gamma:
            stack.extend(prefix + (int(t),) for t in both[::-1])
    return sorted(found)


def evidence_plan(cases) -> list[list[int] | None]:
    """:func:`case_informative_positions` of every case (``None`` for a case not run for a law test)."""
    return [case_informative_positions(c) for c in cases]


def attach_plan(result, case, positions: list[int] | None) -> None:
    """Record a case's plan in its result (``law_informative_positions``). A plan covers the positions
    the scenario tests: a generator that drafted more (a user's, past ``gamma``) tested positions the
    plan never looked at, so it has no plan (no vacuity claim from the laws)."""
    horizon = case.max_new_tokens if case.mode == "generate" else getattr(case.scenario, "gamma", 0) + 1
    result.law_informative_positions = positions if len(result.positions) <= horizon else None


def _informative_reference(scenario, stack: dict) -> bool | None:
    """Whether :func:`reference_informative_positions` is not empty (None where plain sampling fails)."""
    try:
        return bool(reference_informative_positions(scenario, stack))
    except PlainSamplingFails:
        return None


class PairCoverage(NamedTuple):
    """Pairs of warper options and the stacks that test them together (see :func:`pair_coverage`)."""

    covered: int
    total: int
    #: Pairs every stack holding them makes plain sampling fail on the installed transformers (so no
    #: generator can be tested there), sorted: uncovered because of the release, not of the matrix.
    unsampleable: list[tuple[str, str]]


def pair_coverage(stacks: list[dict], options: list[str], scenario) -> PairCoverage:
    """Pairs of ``options`` that some stack holding both tests informatively on ``scenario``
    (:func:`reference_informative_positions` not empty), out of all pairs."""
    held: dict[frozenset, list[bool | None]] = {}  # pair -> per holding stack: informative, or None (fails)
    for stack in stacks:
        present = [o for o in options if o in stack]
        pairs = {frozenset((a, b)) for i, a in enumerate(present) for b in present[i + 1:]}
        if pairs and not all(True in held.get(pair, ()) for pair in pairs):
            informative = _informative_reference(scenario, stack)
            for pair in pairs:
                held.setdefault(pair, []).append(informative)
    covered = sum(True in seen for seen in held.values())
    unsampleable = sorted(tuple(sorted(pair)) for pair, seen in held.items() if all(s is None for s in seen))
    return PairCoverage(covered, len(options) * (len(options) - 1) // 2, unsampleable)
