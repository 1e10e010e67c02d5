"""``lossless-check list``: what can be checked on the installed transformers, and with what."""

from __future__ import annotations

#: Generators that return no ``q``: ``_assisted_decoding`` samples the target at every position. Step
#: mode runs rounds of the real loop for them (``modes.loop_round``); provenance has no q to compare.
NO_Q = ("PromptLookupCandidateGenerator", "AssistedCandidateGeneratorDifferentTokenizers")


def modes_for(name: str) -> str:
    """The modes that give a verdict for the built-in generator ``name`` on this install."""
    from lossless_check.evidence.results import Case
    from lossless_check.modes.generate import skip_reason
    from lossless_check.modes.step import skip_reason as step_skip
    from lossless_check.subjects.adapters import resolve_generator

    generator = resolve_generator(name)
    if generator.generator_class is None:
        return "not installed: every case is skipped"
    modes = [] if step_skip(Case(generator, {})) is not None else ["step (rounds of generate())"] if name in NO_Q \
        else ["step", "provenance"]
    if skip_reason(Case(generator, {}, "generate")) is None:
        modes.append("generate")
    from lossless_check.modes.greedy import skip_reason as greedy_skip

    if greedy_skip(Case(generator, {}, "greedy")) is None:
        modes.append("greedy")
    batched = " (step batched, replayed at batch 1)" if "step" in modes and getattr(generator.adapter, "batchable", False) else ""
    return (", ".join(modes) or "none") + batched


def print_listing() -> int:
    from rich.table import Table
    from transformers.generation import candidate_generator as cg

    from lossless_check.subjects.adapters import ADAPTERS
    from lossless_check.core.compat import versions
    from lossless_check.laws.matrix import MATRIX_NAMES, available_catalog, matrix
    from lossless_check.modes.generate import TINY_LLAMA
    from lossless_check.modes.informativeness import pair_coverage
    from lossless_check.outputs.report import console_for
    from lossless_check.laws.scenarios import DEFAULT, SCENARIOS
    from lossless_check.laws.warpers import format_warpers

    installed = {n for n, obj in vars(cg).items()
                 if isinstance(obj, type) and issubclass(obj, cg.CandidateGenerator) and obj is not cg.CandidateGenerator}
    rows = [[name, modes_for(name) if name in ADAPTERS else "no adapter yet"] for name in sorted(installed | set(ADAPTERS))]
    console = console_for(rows)
    table = Table(title=f"candidate generators in transformers {versions()['transformers_version']}",
                  title_justify="left")
    # A name is pasted into --generator: never cut, in a terminal or a log.
    table.add_column("generator", min_width=max(len(name) for name, _ in rows), overflow="fold")
    table.add_column("modes with a verdict", overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for scenario in SCENARIOS.values():
        about = f": {scenario.description}" if getattr(scenario, "description", "") else ""
        console.print(f"scenario {scenario.name}: vocabulary {scenario.vocab_size}, {scenario.target.kind} target, "
                      f"{scenario.drafter.kind} drafter, gamma {scenario.gamma}{about}", highlight=False)
    console.print(f"scenario {TINY_LLAMA.name}: two seeded 2-layer Llamas, vocabulary {TINY_LLAMA.vocab_size} "
                  "(generate mode only)", highlight=False)
    for entry in available_catalog():
        history = " (history-dependent)" if entry.history_dependent else ""
        console.print(f"warper {entry.option}: {format_warpers(entry.kwargs)}{history}", highlight=False)
    options = [e.option for e in available_catalog()]
    for name in MATRIX_NAMES:
        coverage = pair_coverage(matrix(name), options, DEFAULT)
        console.print(f"matrix {name}: {len(matrix(name))} warper stacks; {coverage.covered}/{coverage.total} pairs of "
                      f"catalog options covered by an informative stack on {DEFAULT.name}", highlight=False)
        if coverage.unsampleable:
            pairs = ", ".join(f"{a} + {b}" for a, b in coverage.unsampleable)
            console.print(f"  not testable on transformers {versions()['transformers_version']} (plain sampling fails "
                          f"under every stack holding them): {pairs}", highlight=False)
    return 0
