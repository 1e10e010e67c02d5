"""Mutation self-test: the harness must flag every known bug class and pass every equivalent change.

:data:`MUTANTS` is the catalog of :mod:`lossless_check.mutants` generators (shipped in the package), each
with the warper stack and scenario under which its bug bites. For a real bug, :func:`exact_tv` gives the exact (float64)
total variation its output law has at the first position the bug reaches, from an independent
model of what it samples and what it returns (the ``drafts`` field): that is the size of effect the
harness has to see, and :func:`samples_needed` turns it into a sample size through the harness's
own power bound. :func:`mutation_report` runs every mutant through :func:`lossless_check.faces.api.run_cases`
in step mode; ``python -m lossless_check.faces.mutation`` prints the table.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from lossless_check.evidence.results import POWER, Case
from lossless_check.faces.api import run_cases
from lossless_check.faces.mutant_catalog import GREEDY_MUTANTS, MUTANTS, Mutant
from lossless_check.laws.expected import ExactLaws, first_token_law
from lossless_check.laws.scenarios import SCENARIOS
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.laws.warpers import capture_processors, format_warpers
from lossless_check.modes.step import STEP_MAX_NEW_TOKENS
from lossless_check.stats import verdict_samples_for_tv
from lossless_check.subjects.adapters import resolve_generator


def installed(mutant: Mutant) -> bool:
    """Whether the installed transformers has the generator class the mutant subclasses, and the
    loop its bug class needs (``mutant.since``)."""
    return _absence(mutant) is None


def _absence(mutant: Mutant) -> str | None:
    """Why the installed release cannot run ``mutant``, or None."""
    import transformers
    from packaging.version import Version
    from transformers.generation import candidate_generator

    if not hasattr(candidate_generator, mutant.family):
        return f"transformers {transformers.__version__} has no {mutant.family}"
    if mutant.since and Version(transformers.__version__) < Version(mutant.since[0]):
        return f"transformers {transformers.__version__}: the bug needs {mutant.since[1]} ({mutant.since[0]} on)"
    return None


def exact_laws(mutant: Mutant) -> ExactLaws:
    """The exact laws of the mutant's case, through the processors ``generate()`` builds for it."""
    scenario = SCENARIOS[mutant.scenario]
    target = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
    processors, _ = capture_processors(target, torch.tensor([scenario.prompt]), mutant.warpers, STEP_MAX_NEW_TOKENS)
    return ExactLaws(scenario, processors)


def _reach(laws: ExactLaws, depth: int) -> list[tuple[tuple, float]]:
    """Accepted draft prefixes of length ``depth`` and their probabilities, for a correct drafter."""
    prefixes = [((), 1.0)]
    for _ in range(depth):
        prefixes = [(prefix + (int(x),), weight * float(overlap[x]))
                    for prefix, weight in prefixes
                    for overlap in [np.minimum(laws.target(prefix), laws.drafter(prefix))]
                    for x in np.flatnonzero(overlap > 0)]
    return prefixes


def _position_strata(mutant: Mutant) -> list[tuple[np.ndarray, float, np.ndarray]]:
    """``(p, reach, law)`` per stratum of the output law at ``mutant.position``: the exact target law,
    the probability that a trial reaches the position in that stratum, and the law the mutant emits
    there. The bug must not act before ``mutant.position``: earlier drafts are accepted as from a
    correct drafter. Trials are grouped by their exact target law, as
    :meth:`lossless_check.modes.step.StepCase.position_strata` does.
    """
    laws = exact_laws(mutant)
    strata: dict[bytes, list] = {}
    for prefix, weight in _reach(laws, mutant.position - 1):
        p = laws.target(prefix)
        emitted = first_token_law(p, *mutant.drafts(laws, prefix))
        entry = strata.setdefault(p.tobytes(), [p, 0.0, np.zeros_like(p)])
        entry[1] += weight
        entry[2] += weight * emitted
    return [(p, reach, mix / reach) for p, reach, mix in strata.values()]


def exact_tv(mutant: Mutant) -> float | None:
    """Exact sample-weighted TV of the output law at ``mutant.position``, as the runner measures it.

    0 for an equivalent mutant; ``None`` if the mutant has no model.
    """
    if mutant.equivalent:
        return 0.0
    if mutant.drafts is None:
        return None
    strata = _position_strata(mutant)
    total = sum(reach for _, reach, _ in strata)
    return float(sum(reach * 0.5 * np.abs(law - p).sum() for p, reach, law in strata) / total)


def information_bound(mutant: Mutant, alpha: float) -> float | None:
    """``log(1/alpha) / KL``: trials that a test knowing the mutant's law needs, on average, to reject
    at level ``alpha`` from the evidence at ``mutant.position`` (Wald; ``KL`` is the expected
    log-likelihood ratio per trial there, the reach probability included). ``0`` when the mutant
    emits tokens outside the target's support (infinite KL); ``None`` for an equivalent mutant.
    """
    if mutant.equivalent or mutant.drafts is None:
        return None
    kl = 0.0
    for p, reach, law in _position_strata(mutant):
        if (law[p == 0] > 0).any():
            return 0.0
        inside = law > 0
        kl += reach * float(np.sum(law[inside] * np.log(law[inside] / p[inside])))
    return math.log(1.0 / alpha) / kl


def samples_needed(mutant: Mutant, alpha: float) -> int | None:
    """Trials after which the runner is sure, with probability ``POWER``, to catch the mutant.

    The smaller of two guarantees: the statistical one (the runner's own worst-case power bound,
    :func:`lossless_check.stats.verdict_samples_for_tv`, at the per-position share of ``alpha``, divided by
    the probability of reaching ``mutant.position``) and the exact one (some trial drafts a token
    its returned q gives probability 0). ``None`` for an equivalent mutant or one without a model.
    """
    tv = exact_tv(mutant)
    if not tv:
        return None
    scenario = SCENARIOS[mutant.scenario]
    laws = exact_laws(mutant)
    reached = _reach(laws, mutant.position - 1)
    per_position = verdict_samples_for_tv(tv, scenario.vocab_size, alpha / (scenario.gamma + 1), POWER)
    statistical = math.ceil(per_position / sum(weight for _, weight in reached))
    impossible = sum(weight * q_sampled[q_returned == 0].sum()
                     for prefix, weight in reached
                     for q_sampled, q_returned in [mutant.drafts(laws, prefix)])
    if impossible == 0:
        return statistical
    return min(statistical, math.ceil(math.log(1.0 / (1.0 - POWER)) / impossible))


def run_mutant(mutant: Mutant, samples: int, seed: int, alpha: float) -> dict:
    """Run one mutant in step mode (sequential: stops at the first trial where the anytime e-value rejects) and in
    provenance mode, and say whether the harness got it right and at how many samples."""
    from lossless_check.modes.provenance import provenance_check

    case = Case(resolve_generator(mutant.spec), mutant.warpers, mode="step", scenario=SCENARIOS[mutant.scenario])
    result = run_cases([case], samples, alpha, seed, sequential=True).cases[0]
    provenance = provenance_check(case, trials=1, seed=seed)
    at = next((p for p in result.positions if p["position"] == mutant.position), {})
    return {
        **_catalog_fields(mutant),
        "mutant": result.generator,
        "verdict": result.verdict,
        "caught": result.verdict == "not_lossless",
        "provenance": provenance.verdict,
        "caught_by": [mode for mode, hit in (("step", result.verdict == "not_lossless"),
                                              ("provenance", provenance.verdict == "inconsistent")) if hit],
        "correct": result.verdict == ("lossless" if mutant.equivalent else "not_lossless"),
        "failed_checks": result.failed_checks,
        "p_value": result.p_value,
        "tv": at.get("tv"),
        "tv_detectable": at.get("tv_detectable"),
        "exact_tv": exact_tv(mutant),
        "samples": result.samples,
        "samples_at_position": at.get("samples"),
        "reason": result.reason,
        "positions": result.positions,
    }


def run_greedy_mutant(mutant: Mutant, seed: int) -> dict:
    """Run one of :data:`GREEDY_MUTANTS` in greedy mode (exact): a bug is caught when its row is
    ``not_lossless`` and every differing comparison's stack holds ``mutant.warpers``."""
    from lossless_check.modes.greedy import run_greedy_case

    result = run_greedy_case(Case(resolve_generator(mutant.spec), {}, "greedy", SCENARIOS[mutant.scenario]), seed)
    facts = result.greedy_equivalence or {}
    first = facts.get("first_difference") or {}
    # Stacks are canonical specs (format_warpers): each of the mutant's options reads the same inside one.
    wanted = [format_warpers({key: value}) for key, value in mutant.warpers.items()]
    only_there = all(all(f",{w}," in f",{stack}," for w in wanted) for stack in facts.get("differing_stacks", []))
    caught = result.verdict == "not_lossless"
    return {
        **_catalog_fields(mutant), "mutant": result.generator, "verdict": result.verdict, "caught": caught,
        "provenance": "-", "caught_by": ["greedy"] if caught else [],
        "correct": result.verdict == "lossless" if mutant.equivalent else caught and only_there,
        "failed_checks": result.failed_checks, "p_value": None, "tv": None, "tv_detectable": None, "exact_tv": None,
        "samples": result.samples, "samples_at_position": None, "reason": result.reason, "positions": [],
        "position": first.get("position", mutant.position), "differing_stacks": facts.get("differing_stacks", []),
    }


def _catalog_fields(mutant: Mutant) -> dict:
    """What a mutant's report row says of its catalog entry."""
    return {"spec": mutant.spec, "warpers": format_warpers(mutant.warpers), "scenario": mutant.scenario,
            "equivalent": mutant.equivalent, "bug": mutant.bug, "position": mutant.position}


def absent_mutant(mutant: Mutant) -> dict:
    """The row of a mutant the installed release cannot run: neither caught nor missed (``correct`` None)."""
    return {**_catalog_fields(mutant), "mutant": mutant.spec.rpartition(":")[2], "verdict": "skipped",
            "caught": False, "provenance": "-", "caught_by": [], "correct": None, "failed_checks": [],
            "p_value": None, "tv": None, "tv_detectable": None, "exact_tv": None, "samples": 0,
            "samples_at_position": None, "positions": [],
            "reason": _absence(mutant)}


def mutation_report(samples: int, seed: int, alpha: float) -> list[dict]:
    """Every mutant of :data:`MUTANTS`, each its own run at family rate ``alpha``, then :data:`GREEDY_MUTANTS`
    (exact, no alpha); a mutant whose base
    class the installed release lacks gets a skipped row (:func:`absent_mutant`)."""
    return ([run_mutant(m, samples, seed, alpha) if installed(m) else absent_mutant(m) for m in MUTANTS]
            + [run_greedy_mutant(m, seed) if installed(m) else absent_mutant(m) for m in GREEDY_MUTANTS])


def print_mutation_report(rows: list[dict], console=None) -> None:
    """The mutation table: one row per mutant, then the mutants the harness got wrong."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="lossless-check mutation report (step mode; caught by greedy: greedy mode)",
                  title_justify="left")
    for column in ("mutant", "warpers", "scenario", "kind", "verdict", "failed checks", "pos", "TV",
                   "exact TV", "detectable TV", "n", "provenance", "caught by", "outcome"):
        table.add_column(column, justify="right" if column in ("pos", "TV", "exact TV", "detectable TV", "n") else "left")

    def fmt(value):
        return "-" if value is None else f"{value:.4f}"

    for row in rows:
        if row["correct"] is None:
            outcome = "[yellow]not on this release[/]"
        elif row["equivalent"]:
            outcome = "[green]passed[/]" if row["correct"] else "[bold red]FALSE ALARM[/]"
        else:
            outcome = "[green]caught[/]" if row["correct"] else "[bold red]MISSED[/]"
        table.add_row(
            row["mutant"], row["warpers"], row["scenario"], "equivalent" if row["equivalent"] else "bug",
            row["verdict"], ", ".join(row["failed_checks"]) or "-", str(row["position"]), fmt(row["tv"]),
            fmt(row["exact_tv"]), fmt(row["tv_detectable"]), str(row["samples"]), row["provenance"],
            ", ".join(row["caught_by"]) or "-", outcome,
        )
    console.print(table)
    for row in rows:
        if row["correct"] is False:
            console.print(f"[bold red]{row['mutant']}[/] [{row['warpers']}]: {row['bug']}: {row['reason']}", highlight=False)
    ran = [row for row in rows if row["correct"] is not None]
    console.print(f"{sum(row['correct'] for row in ran)}/{len(ran)} mutants judged right", highlight=False)
    if len(ran) < len(rows):
        absent = sorted({row["reason"] for row in rows if row["correct"] is None})
        console.print(f"{len(rows) - len(ran)} mutants not run: {'; '.join(absent)}", highlight=False)
