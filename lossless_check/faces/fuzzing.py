"""Property-based fuzzing of a generator over warper stacks: a covering of every option triple, then a
random search (hypothesis).

    import lossless_check as lc

    result = lc.fuzz("DFlashTokenCandidateGenerator")      # -> FuzzResult
    print(result.summary()); assert result.verdict == "lossless"

**What it looks at.** A bug that shows only when three options are stacked passes every pairwise
matrix, and a random stack finds it only where it holds all three *and* leaves the laws room to show a
wrong q (several truncations together leave a point mass wherever a round reaches). So each pass checks
first the stacks of a strength-3 covering (:func:`~lossless_check.modes.covering.triple_covering`: 27 stacks
of at most 7 catalog options at their ``stacked`` values on ``markov8``, each q-informative, every triple of
the 15 options in one of them), then ``examples`` random stacks of
:func:`~lossless_check.strategies.warper_stacks`, sparse (each option present with probability 1/4,
:data:`PRESENCE_BITS`: 3.75 options on average), steered by hypothesis's ``target()`` towards stacks with
more q-informative draft positions and more evidence (the exact pass's provenance TV, the statistical
pass's observed TV over its detectable TV). A vacuous random stack (the processed target a point mass at
every reachable prefix: no q can change the output) is rejected with ``assume`` and does not count.
The result says how many option triples the checked q-informative stacks held (:attr:`FuzzResult.triples`).

**Two passes** over the same stacks:

1. **exact**: the provenance check (:func:`~lossless_check.modes.provenance.provenance_check`, zero false
   failures) of every stack, where the family returns a q;
2. **statistical**: the step-mode check of every stack (exact provenance verdicts reused).

A failing covering stack is shrunk by dropping one option at a time while the check still fails (a
1-minimal stack); a failing random stack by hypothesis. **Error rate**: half of ``alpha`` goes to the
covering, split evenly over its stacks (:func:`alpha_of_covering`); the ``k``-th other statistical test
(random stacks and every shrinking step, both kinds) runs at ``alpha / 2 * 6 / (pi**2 k**2)``
(:func:`alpha_of_test`); these sum to at most ``alpha``, so the chance that a lossless generator fails
``fuzz`` is at most ``alpha`` however long shrinking goes (union bound).

**Power**: every statistical stack states its ``tv_detectable`` (TV at position 1 detected with probability
0.99): about 0.10 at the default 5,000 trials on ``markov8`` (a batched case's figure holds for batch-1
calls: :mod:`~lossless_check.modes.step`).

**Reproducible from the seed alone.** The covering is a function of the scenario and the installed catalog;
the random search draws every choice from fair coins (:mod:`lossless_check.strategies`: hypothesis injects
literals of the local modules it finds in ``sys.modules`` into integer, float and string draws, never into
booleans) under settings fixed here (not the ambient profile's); every check is seeded. So the same seed
checks the same stacks in the same order with the same verdicts whatever else is imported
(:attr:`FuzzResult.digest`). Failing random stacks are also saved in hypothesis's example database
(``database``, a directory) and replayed first the next time; hypothesis's own caches go there too (never a
``.hypothesis`` directory beside it).

A generator that raises or times out is an ``error``, not a losslessness verdict (``alpha`` does not
cover it): the search reports the minimal stack where it does, as an error (exit code 1 all the same).

A search that is killed keeps every stack it checked, and the finished chunks of the test it was
running (:func:`journal_path`, in the database); resumed, it replays the same search and reads those back
instead of checking them again.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

#: Coins that must all come up heads for an option to be in a random stack: probability 1/4, 3.75 of
#: the 15 options on average. Small stacks keep the laws wide enough for a wrong q to show (a random stack
#: of 8 to 13 options at random values usually leaves a point mass wherever a round reaches); triples are
#: the covering's job.
PRESENCE_BITS = 2
#: Hypothesis examples per pass, after the covering's 27 stacks (markov8): about 20 distinct stacks (hypothesis
#: draws some twice; a stack met before is not checked again). Runtime: docs/guides/fuzzing.md.
DEFAULT_EXAMPLES = 30
#: Trials per statistical example: TV ~0.10 detectable at position 1 (V = 8, alpha ~ 1e-8).
DEFAULT_SAMPLES = 5_000
DEFAULT_ALPHA = 1e-6
DEFAULT_SCENARIO = "markov8"
#: Hypothesis's example database of failing stacks, replayed first the next time.
DEFAULT_DATABASE = ".lossless-fuzz"
#: Hypothesis's home directory (its caches) inside the example database's directory.
HYPOTHESIS_HOME = "_hypothesis"
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


@dataclass
class FuzzResult:
    """The outcome of :func:`fuzz`: ``verdict`` ``lossless``, ``not_lossless``, ``error`` (the generator
    raised or timed out: not a losslessness verdict) or ``inconclusive`` (no failure, but no stack's
    statistical test passed with power: every stack checked was vacuous, skipped or inconclusive);
    ``exit_code`` 0 for ``lossless``, 5 (no answer) for ``inconclusive``, else 1. ``triples``: the option
    triples the checked q-informative stacks held (``covered``, of ``total``), and the ones no q-informative
    stack can hold on the scenario (``not_coverable``, with why)."""

    generator: str
    scenario: str
    verdict: str
    alpha: float
    samples: int
    seed: int
    examples: int  # the random search's budget in each pass (beside the covering's stacks)
    stack: str | None = None  # the minimal failing stack, as a --warpers spec
    reason: str = ""
    reproduce: str | None = None
    records: list[dict] = field(default_factory=list)  # one per distinct stack checked, in order
    seconds: float = 0.0
    triples: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        from lossless_check.core.exit_codes import EXIT_NO_ANSWER

        return {"lossless": 0, "inconclusive": EXIT_NO_ANSWER}.get(self.verdict, 1)

    @property
    def alpha_spent(self) -> float:
        """Sum of the alphas of every statistical test made (at most ``alpha``)."""
        return sum(r["alpha"] for r in self.records if r.get("alpha") is not None)

    @property
    def digest(self) -> str:
        """What the search checked, in order, and what it found: a function of its arguments alone
        (the same seed gives the same digest whatever else the interpreter has imported)."""
        checked = [(r["stack"], r.get("phase"), r.get("exact"), r.get("verdict"), r.get("alpha"), r.get("samples"))
                   for r in self.records]
        return hashlib.sha256(repr((checked, self.verdict, self.stack)).encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        return {**asdict(self), "exit_code": self.exit_code, "alpha_spent": self.alpha_spent, "digest": self.digest}

    def search_command(self) -> str:
        """The ``lossless-check fuzz`` command that repeats this search, stack for stack."""
        args = ["lossless-check", "fuzz", "--generator", self.generator, "--seed", str(self.seed)]
        for option, value, default in (("--examples", self.examples, DEFAULT_EXAMPLES),
                                       ("--samples", self.samples, DEFAULT_SAMPLES),
                                       ("--scenario", self.scenario, DEFAULT_SCENARIO),
                                       ("--alpha", self.alpha, DEFAULT_ALPHA)):
            if value != default:
                args += [option, str(value)]
        return shlex.join(args)

    def summary(self) -> str:
        """Lines for a terminal or a test failure: the verdict, the evidence, the minimal stack."""
        from lossless_check.evidence.results import BLIND

        statistical = [r for r in self.records if r.get("verdict") is not None]
        vacuous = sum(r["vacuous"] for r in self.records)
        detectable = [r["tv_detectable"] for r in statistical if r.get("tv_detectable") is not None]
        power = (f"; each detects TV >= {max(detectable):.3f} at position 1 with power 0.99 (worst example)"
                 if detectable else "")
        exact = [r for r in self.records if "exact" in r]
        blind = sum(r["exact"] == "gap" for r in exact)
        blind = f"; on {blind} of the {len(exact)} stacks with an exact pass, {BLIND}" if blind else ""
        triples = (f"; {self.triples['covered']} of {self.triples['total']} option triples held by a checked "
                   f"q-informative stack" if self.triples else "")
        evidence = (f"{len(self.records) - vacuous} stacks checked ({vacuous} vacuous ones skipped){triples}, "
                    f"{len(statistical)} statistical tests spending alpha {self.alpha_spent:.3g} <= {self.alpha:g}"
                    f"{power}{blind}; "
                    f"{self.seconds:.0f} s")
        if self.verdict == "lossless":
            covering = sum(r.get("phase") == COVERING and "verdict" in r for r in self.records)
            searched = sum(r.get("phase") == SEARCH and "verdict" in r for r in self.records)
            return (f"{self.generator}: lossless on {covering} covering stacks and {searched} distinct random ones "
                    f"from {self.examples} hypothesis examples a pass ({evidence})")
        if self.verdict == "inconclusive":
            return f"{self.generator}: NO ANSWER: {self.reason} ({evidence})"
        if self.verdict == "error":
            headline = (f"{self.generator}: ERROR under warpers [{self.stack}] (minimal stack, scenario "
                        f"{self.scenario}; the generator raised or timed out: an error, not a losslessness "
                        f"verdict): {self.reason}")
        else:
            headline = (f"{self.generator}: NOT lossless under warpers [{self.stack}] (minimal stack, "
                        f"scenario {self.scenario}): {self.reason}")
        return "\n".join([headline, f"  evidence: {evidence}", f"reproduce: {self.reproduce}",
                          f"search again (the same stacks, in order): {self.search_command()}"])


#: Where a stack was first met: the covering (and the shrinking of a failing covering stack), or the
#: random search (and hypothesis's shrinking).
COVERING, SEARCH = "covering", "search"


class _Found(Exception):
    """An example failed: raised inside the hypothesis property, so that hypothesis shrinks it."""


class _Examiner:
    """Checks stacks for one fuzz run; every verdict cached by spec (hypothesis revisits stacks)."""

    def __init__(self, generator: str, scenario: str, samples: int, alpha: float, seed: int, progress, journal=None):
        from lossless_check.subjects.adapters import resolve_generator
        from lossless_check.faces.api import resolve_scenario

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


def _exact_failure(record: dict) -> tuple[str, str] | None:
    """``(verdict, why)`` of a stack's exact pass when it fails: ``not_lossless`` or ``error``."""
    if record["exact"] == "inconsistent":
        return "not_lossless", f"provenance: {record['exact_reason']}"
    if record["exact"] == "error":
        return "error", record["exact_reason"]
    return None


def _statistical_failure(record: dict) -> tuple[str, str] | None:
    """``(verdict, why)`` of a stack's statistical test when it fails: ``not_lossless`` or ``error``."""
    if record["verdict"] == "error":
        return "error", record["reason"]
    if record["verdict"] == "not_lossless":
        p = "-" if record["p_value"] is None else format(record["p_value"], ".2g")
        detectable = "-" if record["tv_detectable"] is None else format(record["tv_detectable"], ".4f")
        return ("not_lossless", f"not_lossless at alpha {record['alpha']:.3g} (p={p}, detectable TV {detectable}): "
                                f"{record['reason']}")
    return None


def _no_evidence(records: list[dict]) -> str:
    """Why a search that found no failure still has no answer: what became of each stack it met."""
    outcomes: dict[str, int] = {}
    for r in records:
        said = "vacuous" if r["vacuous"] else f"{r.get('verdict', 'unchecked')}: {r.get('reason', '')}".rstrip(": ")
        outcomes[said] = outcomes.get(said, 0) + 1
    met = "; ".join(f"{n} x {said}" for said, n in outcomes.items()) or "no stack was drawn"
    return f"no stack's statistical test passed with power ({met})"


def _covering(examiner: _Examiner, covering, check: Callable[[dict, str], tuple[str, str] | None],
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


#: :func:`_covering_of` per scenario (kept with the scenario: an id is unique only while its object lives).
_COVERINGS: dict[int, tuple[object, Any]] = {}


def _covering_of(scenario):
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


def _settings(examples: int, database: str | None):
    """Hypothesis settings of the random search, every one fixed here: the ambient profile (a test suite's
    ``derandomize``, ``phases``, ...) changes nothing."""
    from hypothesis import HealthCheck, Phase, Verbosity, settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    return settings(settings.get_profile("default"), max_examples=examples, deadline=None,
                    verbosity=Verbosity.quiet, print_blob=False, derandomize=False, backend="hypothesis",
                    database=DirectoryBasedExampleDatabase(database) if database else None,
                    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
                    report_multiple_bugs=False, suppress_health_check=list(HealthCheck))


def _search(examiner: _Examiner, check: Callable[[dict, str], tuple[str, str] | None],
            evidence: Callable[[dict], float], key: str, examples: int, seed: int,
            database: str | None) -> tuple[dict, tuple[str, str]] | None:
    """Run hypothesis over ``examples`` non-vacuous random stacks (a stack met before, in the covering or
    the search, is not checked again); the minimal failing stack and its ``(verdict, why)``, or None.
    ``evidence(record)`` is what ``target()`` steers up, beside the stack's q-informative draft positions."""
    from hypothesis import assume, given, target
    from hypothesis import seed as seeded

    from lossless_check.strategies import warper_stacks

    failures: dict[str, tuple[str, str]] = {}

    @_settings(examples, database)
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


def _statistical_evidence(record: dict) -> float:
    """The statistical pass's evidence: the observed TV over the TV the test would detect."""
    tv, detectable = record.get("tv"), record.get("tv_detectable")
    return tv / detectable if tv is not None and detectable else 0.0


def journal_identity(generator: str, examples: int, samples: int, scenario: str, seed: int, alpha: float) -> dict:
    """What a fuzz run's journal must agree on before its records are reused."""
    from lossless_check.core.compat import versions

    return {"fuzz": generator, "scenario": scenario, "examples": examples, "samples": samples, "seed": seed,
            "alpha": alpha, **versions()}


def journal_path(database: str, generator: str, scenario: str) -> Path:
    """Where a fuzz run of ``generator`` on ``scenario`` keeps its journal: in its example database."""
    digest = hashlib.sha256(f"{generator}|{scenario}".encode()).hexdigest()[:12]
    return Path(database) / f"journal-{digest}.jsonl"


def fuzz(generator: str, examples: int = DEFAULT_EXAMPLES, samples: int = DEFAULT_SAMPLES,
         scenario: str = DEFAULT_SCENARIO, seed: int = 0, alpha: float = DEFAULT_ALPHA,
         database: str | None = DEFAULT_DATABASE, progress: Callable[[int], None] | None = None,
         journal=None) -> FuzzResult:
    """Fuzz ``generator`` (a built-in name or ``module:attr``): the option-triple covering, then ``examples``
    random warper stacks, each pass exact then statistical (see the module docstring).

    Returns a :class:`FuzzResult`: ``lossless``, or ``not_lossless`` with the minimal failing
    ``stack`` (a ``--warpers`` spec), the ``reason`` and a ``reproduce`` command. The chance that a
    lossless generator is reported ``not_lossless`` is at most ``alpha`` (see the module docstring).
    ``database``: directory of hypothesis's example database (``None``: none). ``progress(trials)``
    is called after each statistical test. ``journal`` (a :class:`~lossless_check.running.journal.EntryLog` of
    :func:`journal_identity`): every stack's checks are kept there as they finish, and the chunks of the
    statistical test running; the stacks it holds are not checked again (``lossless-check fuzz --resume``).
    """
    started = time.perf_counter()
    examiner = _Examiner(generator, scenario, samples, alpha, seed, progress or (lambda trials: None), journal)
    covering = _covering_of(examiner.scenario)
    identity = f"lossless-fuzz|{generator}|{scenario}"
    cover_alpha = alpha_of_covering(alpha, len(covering.stacks))

    def exact(stack, phase):
        return _exact_failure(examiner.exact(stack, phase))

    def statistical(stack, phase):
        if exact(stack, phase) is not None:
            return exact(stack, phase)
        in_covering = phase == COVERING and stack in covering.stacks
        return _statistical_failure(examiner.statistical(stack, phase, cover_alpha if in_covering else None))

    with _hypothesis_home(database):
        found, mode, checked = _covering(examiner, covering, exact), "provenance", "exact"
        if found is None:
            found = _search(examiner, exact, lambda r: r.get("exact_tv") or 0.0, identity + "|exact", examples,
                            seed, database)
        if found is None:
            mode, checked = "step", "verdict"
            found = _covering(examiner, covering, statistical) or _search(
                examiner, statistical, _statistical_evidence, identity + "|statistical", examples, seed, database)
    result = FuzzResult(generator, scenario, "lossless", alpha, samples, seed, examples,
                        records=list(examiner.records.values()), triples=examiner.triples(covering, checked))
    if found is not None:
        record, (verdict, why) = found
        mode = "provenance" if _exact_failure(record) else mode
        result.verdict, result.stack, result.reason = verdict, record["stack"], why
        result.reproduce = reproduce_command(generator, record, scenario, mode, seed)
    elif not any(r.get("verdict") == "lossless" for r in result.records):
        result.verdict, result.reason = "inconclusive", _no_evidence(result.records)
    result.seconds = time.perf_counter() - started
    return result


@contextlib.contextmanager
def _hypothesis_home(database: str | None):
    """Hypothesis keeps caches in its home directory, by default ``./.hypothesis`` (e.g. the constants
    it collects from loaded modules): during a search, under the example database's directory (a
    temporary one without a database), so that fuzzing leaves only ``database`` behind. Restored after."""
    import tempfile

    from hypothesis import configuration

    previous = getattr(configuration, "__hypothesis_home_directory", None)  # None: resolved on next use
    with contextlib.ExitStack() as stack:
        home = (Path(database) / HYPOTHESIS_HOME if database
                else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="lossless-fuzz-"))))
        configuration.set_hypothesis_home_dir(home)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(previous)


def reproduce_command(generator: str, record: dict, scenario: str, mode: str, seed: int) -> str:
    """The ``lossless-check run`` command repeating a failing example: the same data, alpha and verdict."""
    args = ["lossless-check", "run", "--generator", generator, "--warpers", record["stack"] or "none",
            "--scenario", scenario, "--mode", mode, "--seed", str(seed)]
    if mode == "step":
        args += ["--samples", str(record["planned"]), "--alpha", repr(record["alpha"])]
    return shlex.join(args)
