"""The cases of a run: which generator x warper stack x mode x scenario rows a run, a check or a gate
holds (:func:`cases_for`), and the scenarios by name (:func:`resolve_scenario`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

from lossless_check.core.errors import UsageError
from lossless_check.evidence.results import Case
from lossless_check.modes import MODES, STATISTICAL_MODES

#: The scenario of the CLI, the plugin and the API alike.
DEFAULT_SCENARIO = "markov8"


def resolve_scenario(name: str, mode: str = "step"):
    """A scenario by name: ``markov8``, ``iid8`` (fixed logits) or ``tiny-llama`` (generate mode only)."""
    from lossless_check.laws.scenarios import SCENARIOS

    if name == "tiny-llama":
        if mode not in ("generate", "greedy"):
            raise UsageError("the tiny-llama scenario runs in generate and greedy modes only "
                             "(--mode generate or greedy)")
        from lossless_check.modes.generate import TINY_LLAMA

        return TINY_LLAMA
    if name == "markov8-seq2seq":
        if mode not in ("generate", "options"):
            raise UsageError("the markov8-seq2seq scenario (encoder-decoder stubs) runs in generate and options "
                             "modes only (--mode generate or options)")
        from lossless_check.modes.seq2seq import SEQ2SEQ

        return SEQ2SEQ
    if name not in SCENARIOS:
        raise UsageError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}, tiny-llama, markov8-seq2seq")
    if SCENARIOS[name].target_kind is not None and mode not in ("generate", "greedy"):
        raise UsageError(f"the {name} scenario runs in generate and greedy modes only (--mode generate or greedy): "
                         f"its target's state is rolled back by the generate() loop, which step mode does not run")
    return SCENARIOS[name]


def _stacks(warpers) -> list[dict[str, Any]]:
    from lossless_check.laws.warpers import parse_warpers

    if warpers is None:
        return []
    if isinstance(warpers, (str, dict)):
        warpers = [warpers]
    stacks = []
    for stack in warpers:
        if isinstance(stack, str):
            stacks.append(parse_warpers(stack))
        else:
            from lossless_check.laws.warpers import validate_warpers

            validate_warpers(dict(stack))
            stacks.append(dict(stack))
    return stacks


def cases_for(generators: Iterable[str] | str | None = None, warpers=None, matrix: str | None = None,
              mode: str = "step", scenario: str | None = None, max_new_tokens: int = 4,
              sampler=None, torch_draws: bool = False) -> list[Case]:
    """The cases of a run: every generator x warper stack (``--warpers`` stacks, then the matrix's).

    ``scenario=None``: the stacks run on :data:`DEFAULT_SCENARIO`, and a ``default`` or ``full``
    matrix adds its real-world slices (:func:`~lossless_check.laws.matrix.real_world_slices`) in the
    run's step-side mode; a named scenario runs every stack there and nothing else. Greedy rows
    (:func:`greedy_cases`): ``mode="greedy"`` runs only them; a step or all run over the whole install
    (``generators=None``: the main job) adds them. ``sampler`` (``module:function``, a function or a
    :class:`~lossless_check.subjects.sampler.Sampler`) runs in place of the installed ``_speculative_sampling``
    in the cases that call it (step, generate; greedy and provenance cases never do).
    ``torch_draws``: every case draws with torch's own kernel (:func:`with_torch_draws`).
    """
    cases = with_torch_draws(_cases(generators, warpers, matrix, mode, scenario, max_new_tokens), torch_draws)
    if sampler is None:
        return cases
    from lossless_check.subjects.sampler import load_sampler

    sampler = load_sampler(sampler)
    return [replace(c, sampler=sampler) if c.mode in STATISTICAL_MODES else c for c in cases]


def _cases(generators, warpers, matrix, mode, scenario, max_new_tokens) -> list[Case]:
    from lossless_check.laws.matrix import matrix as matrix_stacks
    from lossless_check.subjects.adapters import DEFAULT_GENERATORS, resolve_generator

    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if isinstance(generators, str):
        generators = [generators]
    resolved = [resolve_generator(g) for g in (generators or DEFAULT_GENERATORS)]
    stacks = _stacks(warpers)
    if mode == "greedy":
        return greedy_cases(resolved, stacks, scenario)
    if mode == "options":
        from lossless_check.modes.loop_options import options_cases

        return options_cases(resolved, resolve_scenario(scenario or DEFAULT_SCENARIO, mode), stacks)
    matrix_name = matrix or (None if stacks else "default")
    if matrix_name:
        stacks += matrix_stacks(matrix_name)
    modes = ["all", "generate"] if mode == "all" else [mode]
    cases = []
    for m in modes:
        chosen = resolve_scenario(scenario or DEFAULT_SCENARIO, m)
        cases += [Case(g, w, m, chosen, max_new_tokens) for g in resolved for w in stacks]
    if scenario is None and matrix_name:
        cases += real_world_cases(resolved, matrix_name, modes[0], max_new_tokens)
        if "generate" in modes:
            cases += stateful_cases(resolved, stacks, max_new_tokens)
    if generators is None and mode in ("step", "all"):
        cases += greedy_cases(resolved, [], scenario)
    return cases


def with_torch_draws(cases: list[Case], torch_draws: bool = True) -> list[Case]:
    """``cases`` drawing every token with torch's own kernel where ``torch_draws`` (``--torch-draws``): in
    step mode, at V >= 1,024, no draw of the installed verifier or of a batched call by inverse CDF
    (:class:`~lossless_check.modes.interception.VerifierDraws`); the other modes draw so anyway."""
    return [replace(c, torch_draws=True) for c in cases] if torch_draws else cases


def greedy_cases(generators: list, stacks: list[dict[str, Any]], scenario: str | None = None) -> list[Case]:
    """Greedy mode's rows (:mod:`~lossless_check.modes.greedy`): one per resolved generator and base stack
    (none given: one per generator, the greedy processors alone and in pairs on top of no warper).

    ``scenario=None``: on :data:`DEFAULT_SCENARIO`, plus the tiny Llamas for the generators they drive
    (assistant model and prompt lookup: a real model's cache and positions, 4.39-4.40's stale positions);
    a named scenario: there only.
    """
    from lossless_check.modes.loop_models import ASSISTED, PROMPT_LOOKUP

    chosen = resolve_scenario(scenario or DEFAULT_SCENARIO, "greedy")
    cases = [Case(g, w, "greedy", chosen) for g in generators for w in (stacks or [{}])]
    if scenario is None:
        tiny = resolve_scenario("tiny-llama", "greedy")
        cases += [Case(g, w, "greedy", tiny) for g in generators for w in (stacks or [{}])
                  if g.adapter.name in (ASSISTED, PROMPT_LOOKUP)]
        cases += stateful_cases(generators, stacks or [{}], mode="greedy")
    return cases


def stateful_cases(generators: list, stacks: list[dict[str, Any]], max_new_tokens: int = 4,
                   mode: str = "generate") -> list[Case]:
    """The rows of the targets that keep their history in state (``markov8-linear``, ``-hybrid``, ``-sliding``,
    ``-static`` ...: :data:`~lossless_check.laws.scenarios.STATEFUL`) for resolved ``generators``, in generate
    (every stack) or greedy mode. The kinds of :data:`~lossless_check.laws.scenarios.CROP_ONLY_KINDS` take in
    generate mode only the stacks of the ``smoke`` matrix among ``stacks`` (the first stack where none is):
    they are there to run their layer's ``crop``, and the whole matrix meets the same states on the first four.

    Where a generator cannot run on a kind at all (the release refuses the kind, or the family cannot pair
    with it: :func:`~lossless_check.modes.loop_models.target_kind_reason`), one row per mode says so
    (``skipped``, not applicable) instead of a row per stack.
    """
    from lossless_check.laws.matrix import matrix
    from lossless_check.laws.scenarios import CROP_ONLY_KINDS, STATEFUL
    from lossless_check.modes import skip_reason

    smoke = matrix("smoke")
    cases = []
    for scenario in STATEFUL.values():
        kind_stacks = stacks
        if mode == "generate" and scenario.target_kind in CROP_ONLY_KINDS:
            kind_stacks = [w for w in stacks if w in smoke] or stacks[:1]
        for g in generators:
            rows = [Case(g, w, mode, scenario, max_new_tokens) for w in kind_stacks]
            cases += rows[:1] if rows and skip_reason(rows[0]) is not None else rows
    return cases


def real_world_cases(generators: list, matrix_name: str, mode: str, max_new_tokens: int = 4) -> list[Case]:
    """The real-world slices of matrix ``matrix_name`` (:func:`~lossless_check.laws.matrix.real_world_slices`)
    for resolved ``generators``, in ``mode`` (none in generate mode)."""
    from lossless_check.laws.matrix import real_world_slices

    if mode == "generate":
        return []
    return [Case(g, stack, mode, resolve_scenario(name, mode), max_new_tokens)
            for name, stack in real_world_slices(matrix_name) for g in generators]
