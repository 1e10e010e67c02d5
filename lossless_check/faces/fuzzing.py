"""Property-based fuzzing of a generator over random warper stacks (hypothesis).

    import lossless_check as lc

    result = lc.fuzz("DFlashTokenCandidateGenerator")      # -> FuzzResult
    print(result.summary()); assert result.verdict == "lossless"

Each example is one stack of :func:`~lossless_check.strategies.warper_stacks` (every catalog
option present with probability 2/3, :data:`PRESENCE_ODDS`: a given triple of options is in an
example's stack with probability 8/27, were hypothesis's draws independent) on one fixed-logits
scenario. The search runs in two passes over the same budget:

1. **exact**: the provenance check (:func:`~lossless_check.modes.provenance.provenance_check`,
   zero false failures) of every example, where the family returns a q. A failure is shrunk, by
   the exact check alone, to a minimal stack: seconds, however many shrink steps.
2. **statistical**: the step-mode check of every example (exact provenance verdicts reused). The
   ``k``-th statistical test the pass makes, shrinking's included, runs at
   ``alpha_k = alpha * 6 / (pi**2 * k**2)``; ``sum_k alpha_k <= alpha``, so the chance that a lossless
   generator fails ``fuzz`` is at most ``alpha`` however long shrinking goes (union bound).

Power: every statistical example states its ``tv_detectable`` (TV at position 1 detected with
probability 0.99); at the default 5,000 trials and ``alpha = 1e-6`` it is about 0.10 at V = 8
(a batched case's figure holds for batch-1 calls: :mod:`~lossless_check.modes.step`).
Coverage: hypothesis's draws are not independent (it mutates earlier examples), so the chance that
the default budget puts a given triple of options in some stack is measured, not computed: see
:data:`DEFAULT_EXAMPLES`.

A stack whose processed target is a point mass at every reachable prefix (``vacuous``: no q can
change what is emitted) is no evidence: such examples are rejected with ``assume`` and do not count
towards the budget. Failing stacks are saved in hypothesis's example database (``database``, a
directory) and replayed first the next time; hypothesis's own caches go there too (never a
``.hypothesis`` directory beside it).

A generator that raises or times out is an ``error``, not a losslessness verdict (``alpha`` does not
cover it): the search reports the minimal stack where it does, as an error (exit code 1 all the same).

A search that is killed keeps every stack it checked, and the finished chunks of the test it was
running (:func:`journal_path`, in the database); resumed, it replays the same search (hypothesis is
seeded) and reads those back instead of checking them again.
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

#: Odds of an option being present in a stack: 2 to 1 (probability 2/3). At 1 to 1 hypothesis's
#: draws hit a given triple in only 81-88% of 40-example searches (200 seeds, the same three triples).
PRESENCE_ODDS = 2
#: Examples per pass. Measured over 100 hypothesis seeds (drawing only): a given triple of options
#: is in some stack of the 60 in 99%, 100% and 100% of searches (temperature/top_k/
#: repetition_penalty, no_repeat_ngram_size/repetition_penalty/top_p, min_p/typical_p/suppress_tokens);
#: at 50 examples 98%, 100%, 100%.
DEFAULT_EXAMPLES = 60
#: Trials per statistical example: TV ~0.10 detectable at position 1 (V = 8, alpha_k ~ 1e-9).
DEFAULT_SAMPLES = 5_000
DEFAULT_ALPHA = 1e-6
DEFAULT_SCENARIO = "markov8"
#: Hypothesis's example database of failing stacks, replayed first the next time.
DEFAULT_DATABASE = ".lossless-fuzz"
#: Hypothesis's home directory (its caches) inside the example database's directory.
HYPOTHESIS_HOME = "_hypothesis"
#: ``sum_{k>=1} SPENDING / k**2 == 1``.
SPENDING = 6 / math.pi**2


def alpha_of_test(alpha: float, k: int) -> float:
    """Alpha of the ``k``-th statistical test (1-based) of a fuzz run of family rate ``alpha``."""
    return alpha * SPENDING / k**2


@dataclass
class FuzzResult:
    """The outcome of :func:`fuzz`: ``verdict`` ``lossless``, ``not_lossless``, ``error`` (the generator
    raised or timed out: not a losslessness verdict) or ``inconclusive`` (no failure, but no stack's
    statistical test passed with power: every stack checked was vacuous, skipped or inconclusive);
    ``exit_code`` 0 for ``lossless``, 5 (no answer) for ``inconclusive``, else 1."""

    generator: str
    scenario: str
    verdict: str
    alpha: float
    samples: int
    seed: int
    examples: int  # the budget of each pass
    stack: str | None = None  # the minimal failing stack, as a --warpers spec
    reason: str = ""
    reproduce: str | None = None
    records: list[dict] = field(default_factory=list)  # one per distinct stack checked, in order
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        from lossless_check.core.exit_codes import EXIT_NO_ANSWER

        return {"lossless": 0, "inconclusive": EXIT_NO_ANSWER}.get(self.verdict, 1)

    @property
    def alpha_spent(self) -> float:
        """Sum of the alphas of every statistical test made (at most ``alpha``)."""
        return sum(r["alpha"] for r in self.records if r.get("alpha") is not None)

    def to_dict(self) -> dict:
        return {**asdict(self), "exit_code": self.exit_code, "alpha_spent": self.alpha_spent}

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
        evidence = (f"{len(self.records) - vacuous} stacks checked ({vacuous} vacuous ones skipped), "
                    f"{len(statistical)} statistical tests spending alpha {self.alpha_spent:.3g} <= {self.alpha:g}"
                    f"{power}{blind}; "
                    f"{self.seconds:.0f} s")
        if self.verdict == "lossless":
            return f"{self.generator}: lossless on {self.examples} examples of random warper stacks ({evidence})"
        if self.verdict == "inconclusive":
            return f"{self.generator}: NO ANSWER: {self.reason} ({evidence})"
        if self.verdict == "error":
            headline = (f"{self.generator}: ERROR under warpers [{self.stack}] (minimal stack, scenario "
                        f"{self.scenario}; the generator raised or timed out: an error, not a losslessness "
                        f"verdict): {self.reason}")
        else:
            headline = (f"{self.generator}: NOT lossless under warpers [{self.stack}] (minimal stack, "
                        f"scenario {self.scenario}): {self.reason}")
        return "\n".join([headline, f"  evidence: {evidence}", f"reproduce: {self.reproduce}"])


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
        self.tests = sum("verdict" in r for r in self.records.values())

    def case(self, stack: dict[str, Any]):
        from lossless_check.evidence.results import Case

        return Case(self.generator, stack, "step", self.scenario)

    def record(self, stack: dict[str, Any]) -> dict:
        from lossless_check.laws.warpers import format_warpers

        spec = format_warpers(stack)
        if spec not in self.records:
            self.records[spec] = {"stack": spec, "options": len([k for k in stack if k != "eos_token_id"]),
                                  "vacuous": is_vacuous(self.case(stack))}
            self.keep(self.records[spec])  # in the order hypothesis draws them: the result lists them so
        return self.records[spec]

    def exact(self, stack: dict[str, Any]) -> dict:
        """The record with its provenance verdict (``not_applicable`` where the family returns no q)."""
        from lossless_check.core.errors import GeneratorFailure, NotApplicable
        from lossless_check.modes.provenance import PROVENANCE_TRIALS, provenance_check
        from lossless_check.modes.step import skip_reason

        record = self.record(stack)
        if "exact" not in record:
            case = self.case(stack)
            try:
                if skip_reason(case) is not None:
                    raise NotApplicable(skip_reason(case))
                result = provenance_check(case, PROVENANCE_TRIALS, self.seed)
                record["exact"], record["exact_reason"] = result.verdict, result.reason
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

    def statistical(self, stack: dict[str, Any]) -> dict:
        """The record with its step-mode verdict, at the next alpha of the spending sequence."""
        from lossless_check.faces.api import run_cases

        record = self.exact(stack)
        if "verdict" not in record:
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


def _search(examiner: _Examiner, check: Callable[[dict], tuple[str, str] | None], key: str, examples: int,
            seed: int, database: str | None) -> tuple[dict, tuple[str, str]] | None:
    """Run hypothesis over ``examples`` non-vacuous stacks; the minimal failing stack and its
    ``(verdict, why)``, or None."""
    from hypothesis import HealthCheck, Verbosity, assume, given, settings
    from hypothesis import seed as seeded
    from hypothesis.database import DirectoryBasedExampleDatabase

    from lossless_check.strategies import warper_stacks

    failures: dict[str, tuple[str, str]] = {}

    @settings(max_examples=examples, deadline=None, verbosity=Verbosity.quiet, print_blob=False,
              database=DirectoryBasedExampleDatabase(database) if database else None,
              suppress_health_check=list(HealthCheck))
    @seeded(seed)
    @given(warper_stacks(presence_odds=PRESENCE_ODDS))
    def search(stack):
        record = examiner.record(stack)
        assume(not record["vacuous"])
        why = check(stack)
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
    """Fuzz ``generator`` (a built-in name or ``module:attr``) over random warper stacks.

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
    identity = f"lossless-fuzz|{generator}|{scenario}"
    with _hypothesis_home(database):
        found = _search(examiner, lambda s: _exact_failure(examiner.exact(s)), identity + "|exact", examples, seed,
                        database)
        mode = "provenance"
        if found is None:
            found = _search(examiner, lambda s: _exact_failure(examiner.exact(s)) or _statistical_failure(
                examiner.statistical(s)), identity + "|statistical", examples, seed, database)
            mode = "step"
    result = FuzzResult(generator, scenario, "lossless", alpha, samples, seed, examples,
                        records=list(examiner.records.values()))
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
