"""The search of a fuzz run (:mod:`lossless_check.faces.fuzzing`): the checks of one stack with their alphas
(:class:`Examiner`), the covering's pass with its shrinking (:func:`covering_pass`), and the random search
(:func:`random_search`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

#: Coins that must all come up heads for an option to be in a random stack: probability 1/4, 3.75 of
#: the 15 options on average. Small stacks keep the laws wide enough for a wrong q to show (a random stack
#: of 8 to 13 options at random values usually leaves a point mass wherever a round reaches); triples are
#: the covering's job.
PRESENCE_BITS = 2
#: ``sum_{k>=1} SPENDING / k**2 == 1``.
SPENDING = 6 / math.pi**2
#: The share of a search's alpha spent on the covering's stacks (the rest on the spending sequence).
COVERING_SHARE = 0.5


def alpha_of_test(alpha: float, k: int) -> float:
    """Alpha of the ``k``-th statistical test (1-based) outside the covering (random stacks, shrinking) of a
    fuzz run of family rate ``alpha``."""
    return (1 - COVERING_SHARE) * alpha * SPENDING / k**2


def alpha_of_covering(alpha: float, stacks: int) -> float:
    """Alpha of each of the ``stacks`` covering stacks' statistical tests (Bonferroni over a set fixed
    before any data: the covering depends on the scenario and the catalog only)."""
    return COVERING_SHARE * alpha / max(1, stacks)


#: Where a stack was first met: the covering (and the shrinking of a failing covering stack), or the
#: random search (and hypothesis's shrinking).
COVERING, SEARCH = "covering", "search"


class _Found(Exception):
    """An example failed: raised inside the hypothesis property, so that hypothesis shrinks it."""


class Examiner:
    """Checks stacks for one fuzz run; every verdict cached by spec (hypothesis revisits stacks)."""

    def __init__(self, generator: str, scenario: str, samples: int, alpha: float, seed: int, progress, journal=None):
        from lossless_check.faces.api import resolve_scenario
        from lossless_check.subjects.adapters import resolve_generator

        self.spec, self.samples, self.alpha, self.seed, self.progress = generator, samples, alpha, seed, progress
        self.generator = resolve_generator(generator)
        self.scenario_name, self.scenario = scenario, resolve_scenario(scenario)
        # What an interrupted search checked (its last entry per stack): read back, not checked again, so
        # each statistical test keeps the alpha it was made at, and new ones take the next ones.
        self.journal = journal
        self.records: dict[str, dict] = {e["stack"]: e for e in (journal.entries if journal is not None else [])}
        self.tests = sum("verdict" in r and r.get("phase") != COVERING for r in self.records.values())

    def case(self, stack: dict[str, Any]):
        from lossless_check.evidence.results import Case

        return Case(self.generator, stack, "step", self.scenario)

    def record(self, stack: dict[str, Any], phase: str = SEARCH) -> dict:
        from lossless_check.core.errors import PlainSamplingFails
        from lossless_check.laws.warpers import format_warpers
        from lossless_check.modes.informativeness import q_informative_positions

        spec = format_warpers(stack)
        if spec not in self.records:
            try:
                positions = q_informative_positions(self.scenario, stack)
            except PlainSamplingFails:
                positions = []
            self.records[spec] = {"stack": spec, "phase": phase,
                                  "options": len([k for k in stack if k != "eos_token_id"]),
                                  "vacuous": is_vacuous(self.case(stack)), "q_informative_positions": positions}
            self.keep(self.records[spec])  # in the order the search meets them: the result lists them so
        return self.records[spec]

    def exact(self, stack: dict[str, Any], phase: str = SEARCH) -> dict:
        """The record with its provenance verdict (``not_applicable`` where the family returns no q) and its
        largest TV between a returned q and the law its draft was drawn from (``exact_tv``)."""
        from lossless_check.core.errors import GeneratorFailure, NotApplicable
        from lossless_check.modes.provenance import PROVENANCE_TRIALS, provenance_check
        from lossless_check.modes.step import skip_reason

        record = self.record(stack, phase)
        if "exact" not in record:
            case = self.case(stack)
            try:
                if skip_reason(case) is not None:
                    raise NotApplicable(skip_reason(case))
                result = provenance_check(case, PROVENANCE_TRIALS, self.seed)
                record["exact"], record["exact_reason"] = result.verdict, result.reason
                record["exact_tv"] = max((p.tv for p in result.positions), default=0.0)
            except NotApplicable as exc:
                record["exact"], record["exact_reason"] = "not_applicable", str(exc)
            except GeneratorFailure as exc:
                record["exact"], record["exact_reason"] = "error", str(exc)
            self.keep(record)
        return record

    def keep(self, record: dict) -> None:
        """Journal a record as it is now (on disk before the search goes on)."""
        if self.journal is not None:
            self.journal.append(dict(record))

    def statistical(self, stack: dict[str, Any], phase: str = SEARCH, alpha: float | None = None) -> dict:
        """The record with its step-mode verdict, at ``alpha`` (default: the next alpha of the spending
        sequence, :func:`alpha_of_test`)."""
        from lossless_check.faces.api import run_cases

        record = self.exact(stack, phase)
        if "verdict" not in record:
            if alpha is None:
                self.tests += 1
                alpha = alpha_of_test(self.alpha, self.tests)
            chunks = self.journal.chunks if self.journal is not None else None
            case = self.case(stack)
            result = run_cases([case], self.samples, alpha, self.seed, chunks=chunks).cases[0]
            record.update(verdict=result.verdict, alpha=alpha, reason=result.reason, p_value=result.p_value,
                          tv=result.tv, tv_detectable=result.tv_detectable, seconds=result.seconds,
                          planned=self.samples, samples=result.samples)
            self.keep(record)
            if chunks is not None:
                chunks.discard(case.key)
            self.progress(result.samples)
        return record

    def triples(self, covering, checked: str) -> dict:
        """:attr:`FuzzResult.triples`: option triples held by a q-informative stack with a ``checked`` entry
        (``exact`` or ``verdict``)."""
        from lossless_check.laws.warpers import parse_warpers
        from lossless_check.modes.covering import triples_of

        held: set = set()
        for record in self.records.values():
            if record.get(checked) is not None and record["q_informative_positions"]:
                held |= triples_of(parse_warpers(record["stack"]), covering.options)
        return {"covered": len(held), "total": covering.triples, "covering_stacks": len(covering.stacks),
                "not_coverable": {", ".join(t): why for t, why in covering.uncovered.items()}}


def is_vacuous(case) -> bool:
    """Whether the processed target is a point mass at every reachable prefix of the ``gamma + 1``
    positions of a round: the output is then fixed, and no q (right or wrong) can change it."""
    from lossless_check.modes.step import StepCase

    laws = StepCase(case).laws
    prefix: tuple[int, ...] = ()
    for _ in range(case.scenario.gamma + 1):
        support = (laws.target(prefix) > 0).nonzero()[0]
        if len(support) > 1:
            return False
        prefix += (int(support[0]),)
    return True


def exact_failure(record: dict) -> tuple[str, str] | None:
    """``(verdict, why)`` of a stack's exact pass when it fails: ``not_lossless`` or ``error``."""
    if record["exact"] == "inconsistent":
        return "not_lossless", f"provenance: {record['exact_reason']}"
    if record["exact"] == "error":
        return "error", record["exact_reason"]
    return None


def statistical_failure(record: dict) -> tuple[str, str] | None:
    """``(verdict, why)`` of a stack's statistical test when it fails: ``not_lossless`` or ``error``."""
    if record["verdict"] == "error":
        return "error", record["reason"]
    if record["verdict"] == "not_lossless":
        p = "-" if record["p_value"] is None else format(record["p_value"], ".2g")
        detectable = "-" if record["tv_detectable"] is None else format(record["tv_detectable"], ".4f")
        return ("not_lossless", f"not_lossless at alpha {record['alpha']:.3g} (p={p}, detectable TV {detectable}): "
                                f"{record['reason']}")
    return None


def no_evidence(records: list[dict]) -> str:
    """Why a search that found no failure still has no answer: what became of each stack it met."""
    outcomes: dict[str, int] = {}
    for r in records:
        said = "vacuous" if r["vacuous"] else f"{r.get('verdict', 'unchecked')}: {r.get('reason', '')}".rstrip(": ")
        outcomes[said] = outcomes.get(said, 0) + 1
    met = "; ".join(f"{n} x {said}" for said, n in outcomes.items()) or "no stack was drawn"
    return f"no stack's statistical test passed with power ({met})"


def covering_pass(examiner: Examiner, covering, check: Callable[[dict, str], tuple[str, str] | None],
              shrink: bool = True) -> tuple[dict, tuple[str, str]] | None:
    """Check every covering stack in order; at the first failure, the 1-minimal failing stack (options
    dropped one at a time, the latest in catalog order first, while ``check`` still fails; the failing
    covering stack itself without ``shrink``) and its ``(verdict, why)``; None if none fails."""
    from lossless_check.laws.warpers import format_warpers
    from lossless_check.strategies import AUXILIARY

    for stack in covering.stacks:
        why = check(stack, COVERING)
        if why is None:
            continue
        smaller = shrink
        while smaller:
            smaller = False
            for option in reversed([k for k in stack if k not in AUXILIARY]):
                candidate = _without(stack, option)
                if candidate and examiner.record(candidate, COVERING)["vacuous"]:
                    continue
                found = check(candidate, COVERING)
                if found is not None:
                    stack, why, smaller = candidate, found, True
                    break
        return examiner.records[format_warpers(stack)], why
    return None


#: :func:`covering_of` per scenario (kept with the scenario: an id is unique only while its object lives).
_COVERINGS: dict[int, tuple[object, Any]] = {}


def covering_of(scenario):
    """The option-triple covering of ``scenario`` on the installed catalog, built once per process."""
    from lossless_check.laws.matrix import available_catalog
    from lossless_check.modes.covering import triple_covering

    if _COVERINGS.get(id(scenario), (None,))[0] is not scenario:
        _COVERINGS[id(scenario)] = scenario, triple_covering(scenario, available_catalog())
    return _COVERINGS[id(scenario)][1]


def _without(stack: dict[str, Any], option: str) -> dict[str, Any]:
    """``stack`` without ``option`` (and without ``eos_token_id`` once no option that needs it is left)."""
    from lossless_check.strategies import AUXILIARY, EOS_OPTIONS

    kept = {k: v for k, v in stack.items() if k != option}
    if not any(k in kept for k in EOS_OPTIONS):
        kept = {k: v for k, v in kept.items() if k not in AUXILIARY}
    return kept


def search_settings(examples: int, database: str | None):
    """Hypothesis settings of the random search, every one fixed here: the ambient profile (a test suite's
    ``derandomize``, ``phases``, ...) changes nothing."""
    from hypothesis import HealthCheck, Phase, Verbosity, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    return settings(settings.get_profile("default"), max_examples=examples, deadline=None,
                    verbosity=Verbosity.quiet, print_blob=False, derandomize=False, backend="hypothesis",
                    database=DirectoryBasedExampleDatabase(database) if database else None,
                    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
                    report_multiple_bugs=False, suppress_health_check=list(HealthCheck))


def random_search(examiner: Examiner, check: Callable[[dict, str], tuple[str, str] | None],
            evidence: Callable[[dict], float], key: str, examples: int, seed: int,
            database: str | None) -> tuple[dict, tuple[str, str]] | None:
    """Run hypothesis over ``examples`` non-vacuous random stacks (a stack met before, in the covering or
    the search, is not checked again); the minimal failing stack and its ``(verdict, why)``, or None.
    ``evidence(record)`` is what ``target()`` steers up, beside the stack's q-informative draft positions."""
    from hypothesis import assume, given, target
    from hypothesis import seed as seeded

    from lossless_check.strategies import warper_stacks

    failures: dict[str, tuple[str, str]] = {}

    @search_settings(examples, database)
    @seeded(seed)
    @given(warper_stacks(examiner.scenario.vocab_size, presence_bits=PRESENCE_BITS))
    def search(stack):
        record = examiner.record(stack)
        assume(not record["vacuous"])
        why = check(stack, SEARCH)
        target(float(len(record["q_informative_positions"])), label="q-informative draft positions")
        target(float(evidence(record)), label="evidence")
        if why is not None:
            failures[record["stack"]] = why
            raise _Found(record["stack"])

    # One database entry per generator, scenario and pass: a failure is replayed where it was found.
    search.hypothesis.inner_test._hypothesis_internal_add_digest = key.encode()
    try:
        search()
    except _Found as found:
        spec = found.args[0]
        return examiner.records[spec], failures[spec]
    return None


def statistical_evidence(record: dict) -> float:
    """The statistical pass's evidence: the observed TV over the TV the test would detect."""
    tv, detectable = record.get("tv"), record.get("tv_detectable")
    return tv / detectable if tv is not None and detectable else 0.0
