"""Property-based fuzzing of a generator over warper stacks: a covering of every option triple, then a
random search (hypothesis).

    import lossless_check as lc

    result = lc.fuzz("DFlashTokenCandidateGenerator")      # -> FuzzResult
    print(result.summary()); assert result.verdict == "lossless"

**What it looks at.** A bug that shows only when three options are stacked passes every pairwise
matrix, and a random stack finds it only where it holds all three *and* leaves the laws room to show a
wrong q (several truncations together leave a point mass wherever a round reaches). So each pass checks
first the stacks of a strength-3 covering (:func:`~lossless_check.modes.covering.triple_covering`: 50 stacks
of at most 7 catalog options at their ``stacked`` values on ``markov8``, each q-informative, every triple of
the 15 options in two of them with different options beside it), then ``examples`` random stacks of
:func:`~lossless_check.strategies.warper_stacks`, sparse (each option present with probability 1/4,
:data:`~.fuzz_search.PRESENCE_BITS`: 3.75 options on average), steered by hypothesis's ``target()``
towards stacks with more q-informative draft positions and more evidence (the exact pass's provenance TV,
the statistical pass's observed TV over its detectable TV). A vacuous random stack (the processed target a
point mass at every reachable prefix: no q can change the output) is rejected with ``assume`` and does not
count. The result says how many option triples the checked q-informative stacks held
(:attr:`FuzzResult.triples`).

**Two passes** over the same stacks:

1. **exact**: the provenance check (:func:`~lossless_check.modes.provenance.provenance_check`, zero false
   failures) of every stack, where the family returns a q;
2. **statistical**: the step-mode check of every stack (exact provenance verdicts reused).

A failing covering stack is shrunk by dropping one option at a time while the check still fails (a
1-minimal stack); a failing random stack by hypothesis. **Error rate**: half of ``alpha`` goes to the
covering, split evenly over its stacks (:func:`~.fuzz_search.alpha_of_covering`); the ``k``-th other
statistical test (random stacks and every shrinking step, both kinds) runs at ``alpha / 2 * 6 /
(pi**2 k**2)`` (:func:`~.fuzz_search.alpha_of_test`); these sum to at most ``alpha``, so the chance that a
lossless generator fails ``fuzz`` is at most ``alpha`` however long shrinking goes (union bound).

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
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

# DEFAULT_SAMPLES trials per statistical example: TV ~0.10 detectable at position 1 (V = 8, alpha ~ 1e-8).
from lossless_check.core.options import DEFAULT_ALPHA, DEFAULT_SAMPLES
from lossless_check.faces.fuzz_search import (  # noqa: F401 - alpha_of_*, is_vacuous: the module's API
    COVERING,
    SEARCH,
    Examiner,
    alpha_of_covering,
    alpha_of_test,
    covering_of,
    covering_pass,
    exact_failure,
    is_vacuous,
    no_evidence,
    random_search,
    statistical_evidence,
    statistical_failure,
)

#: Hypothesis examples per pass, after the covering's 50 stacks (markov8): about 20 distinct stacks (hypothesis
#: draws some twice; a stack met before is not checked again). Runtime: docs/guides/fuzzing.md.
DEFAULT_EXAMPLES = 30
DEFAULT_SCENARIO = "markov8"
#: Hypothesis's example database of failing stacks, replayed first the next time.
DEFAULT_DATABASE = ".lossless-fuzz"
#: Hypothesis's home directory (its caches) inside the example database's directory.
HYPOTHESIS_HOME = "_hypothesis"
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
    examiner = Examiner(generator, scenario, samples, alpha, seed, progress or (lambda trials: None), journal)
    covering = covering_of(examiner.scenario)
    identity = f"lossless-fuzz|{generator}|{scenario}"
    cover_alpha = alpha_of_covering(alpha, len(covering.stacks))

    def exact(stack, phase):
        return exact_failure(examiner.exact(stack, phase))

    def statistical(stack, phase):
        if exact(stack, phase) is not None:
            return exact(stack, phase)
        in_covering = phase == COVERING and stack in covering.stacks
        return statistical_failure(examiner.statistical(stack, phase, cover_alpha if in_covering else None))

    with _hypothesis_home(database):
        found, mode, checked = covering_pass(examiner, covering, exact), "provenance", "exact"
        if found is None:
            found = random_search(examiner, exact, lambda r: r.get("exact_tv") or 0.0, identity + "|exact", examples,
                            seed, database)
        if found is None:
            mode, checked = "step", "verdict"
            found = covering_pass(examiner, covering, statistical) or random_search(
                examiner, statistical, statistical_evidence, identity + "|statistical", examples, seed, database)
    result = FuzzResult(generator, scenario, "lossless", alpha, samples, seed, examples,
                        records=list(examiner.records.values()), triples=examiner.triples(covering, checked))
    if found is not None:
        record, (verdict, why) = found
        mode = "provenance" if exact_failure(record) else mode
        result.verdict, result.stack, result.reason = verdict, record["stack"], why
        result.reproduce = reproduce_command(generator, record, scenario, mode, seed)
    elif not any(r.get("verdict") == "lossless" for r in result.records):
        result.verdict, result.reason = "inconclusive", no_evidence(result.records)
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
