"""The ``lossless`` fixture of the pytest plugin, its family-wise error control and its messages.

The hooks live in :mod:`lossless_check._pytest_entry` (the ``pytest11`` entry point); this module
holds what they hand out. Importing either pulls in neither torch nor transformers: the harness is
imported by the first :meth:`Lossless.check` of a session.

Family-wise error control
-------------------------
A pytest session is one family: the chance that *any* check of a correct generator fails stays
below ``--lossless-alpha``, however many checks the tests make and however pytest-xdist schedules
them. Check ``k`` (1, 2, ... in the order the test body makes them) of a test gets

    alpha(test, k) = alpha / M * 6 / (pi**2 * k**2)

where ``M`` is the number of *budgeted* tests: the collected tests (after ``-k``/``-m``
deselection) that request the ``lossless`` fixture or carry the ``lossless`` marker. By the union
bound the family rate is at most ``sum_tests alpha/M * sum_k 6/(pi**2 k**2) = alpha``, whatever
the dependence between checks. Nothing needs to know in advance how many checks a test makes.

Why this and not spending over the i-th check of the session: that index depends on the order in
which tests run, which differs between workers and runs under xdist, so the same check would get a
different alpha (and maybe a different verdict) from run to run. Here every input is
scheduling-free: every xdist worker collects the same tests (xdist refuses to run otherwise), so
``M`` is the same everywhere, and ``k`` is fixed by the test's own code. A check's data do not
depend on scheduling either: its random stream is a function of ``--lossless-seed`` and the case
alone (:func:`lossless_check.running.chunks.case_seed`). So a check has the same alpha, p-value and verdict
under ``pytest``, ``pytest -n 2`` and the CLI command its failure message prints; a rerun of a
failed test repeats the same data and adds no chance of a false failure.

A test that obtains the fixture dynamically (``request.getfixturevalue("lossless")``) is not seen
at collection: it must carry ``@pytest.mark.lossless`` to be budgeted, and its checks fail with a
message saying so otherwise.

The marker
----------
``@pytest.mark.lossless`` does three things: it selects (``-m lossless``, ``-m "not lossless"``;
tests requesting the fixture get it automatically), it budgets (above), and its keyword arguments
(:data:`MARKER_OPTIONS`: ``samples``, ``scenario``, ``seed``) are the test's defaults for the
arguments of the same name of every check it makes: ``@pytest.mark.lossless(samples=20_000)`` gives
one test more power without touching the session's options. There is no per-test ``alpha``: the
session's alpha is shared by rule, so that the family rate holds.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from lossless_check.core.options import DEFAULT_ALPHA, DEFAULT_SAMPLES  # noqa: F401 - the plugin's defaults

if TYPE_CHECKING:
    from lossless_check.evidence.results import CaseResult

#: ``sum_{k>=1} SPENDING / k**2 == 1``.
SPENDING = 6 / math.pi**2

DEFAULT_SEED = 0
DEFAULT_SCENARIO = "iid8"
#: Keyword arguments ``@pytest.mark.lossless(...)`` takes: the test's defaults for its checks' arguments.
MARKER_OPTIONS = ("samples", "scenario", "seed")


def check_alpha(alpha_family: float, budgeted_tests: int, index: int) -> float:
    """Alpha of the ``index``-th check (1-based) of a test, among ``budgeted_tests`` budgeted tests."""
    return alpha_family / budgeted_tests * SPENDING / index**2


def reproduce_command(spec: str, warpers: str, scenario: str, samples: int, seed: int, alpha: float) -> str:
    """The ``lossless-check run`` command that repeats a check exactly: same data, same alpha, same verdict.

    Run it from the directory pytest was run from (a ``module:attr`` generator is imported from there).
    """
    args = ["lossless-check", "run", "--generator", spec, "--warpers", warpers, "--mode", "step",
            "--scenario", scenario, "--samples", str(samples), "--seed", str(seed), "--alpha", repr(alpha), "--fixed"]
    return shlex.join(args)


_EXACT_CHECKS = {
    "support": "support: emitted a token the target gives probability 0",
    "impossible_draft": "impossible_draft: drafted a token its returned candidate_logits give probability 0",
}


def failure_message(result: CaseResult, command: str) -> str:
    """A short explanation of a verdict other than ``lossless``: what failed, by how much, how to reproduce."""
    where = f"under warpers [{result.warpers}] (scenario {result.scenario}"
    if result.verdict == "error":
        return f"{result.generator} could not be checked {where}): {result.reason}\nreproduce: {command}"
    if result.verdict == "inconclusive":
        return (f"{result.generator} is not shown lossless {where}, {result.samples} samples, alpha "
                f"{result.alpha_case:.3g}): {result.reason}\nreproduce (with more samples): {command}")
    lines = [f"{result.generator} is not lossless {where}, {result.samples} samples, alpha {result.alpha_case:.3g})",
             f"  failed sub-checks: {', '.join(result.failed_checks)}"]
    lines += [f"  {_EXACT_CHECKS[c]}" for c in result.failed_checks if c in _EXACT_CHECKS]
    for p in result.positions:
        if f"output_law@{p['position']}" in result.failed_checks:
            lines.append(f"  output law at position {p['position']}: TV {p['tv']:.4f} > threshold "
                         f"{p['tv_threshold']:.4f} (p={p['p_value']:.2g}, n={p['samples']})")
    if result.expected_acceptance_rate is not None:
        excess = result.acceptance_rate - result.expected_acceptance_rate
        law = "differs from theory" if "acceptance_law" in result.diagnostics else "agrees with theory"
        lines.append(f"  acceptance rate {result.acceptance_rate:.3f} vs theory {result.expected_acceptance_rate:.3f}: "
                     f"excess {excess:+.3f} (acceptance law {law}, p={result.acceptance_p_value:.2g})")
    if result.diagnostics:
        lines.append(f"  diagnostics (assume the drafter samples the processed drafter table): "
                     f"{', '.join(result.diagnostics)}")
    lines.append(f"reproduce: {command}")
    return "\n".join(lines)


@dataclass
class SessionState:
    """Options, budget and checked cases of one pytest session (one per process; merged on the xdist controller)."""

    alpha: float
    samples: int
    seed: int
    report: str | None
    budgeted: frozenset[str] = frozenset()
    #: One JSON-ready dict per check: the report's case entry plus ``test`` (node id), ``check`` (index in the
    #: test), ``generator_spec`` and ``reproduce`` (the CLI command).
    records: list[dict[str, Any]] = field(default_factory=list)

    def alpha_for(self, nodeid: str, index: int) -> float:
        """The alpha of a test's ``index``-th check; fails the test if it is not budgeted."""
        if nodeid not in self.budgeted:
            pytest.fail(f"{nodeid} is not counted in the lossless-check alpha budget: it gets the lossless "
                        "fixture dynamically; mark it @pytest.mark.lossless", pytrace=False)
        return check_alpha(self.alpha, len(self.budgeted), index)

    def sorted_records(self) -> list[dict[str, Any]]:
        """Records in a scheduling-free order: by test id, then check index."""
        return sorted(self.records, key=lambda r: (r["test"], r["check"]))

    def report_document(self) -> dict:
        """The ``--lossless-report`` document: every check of the session, in the schema of ``report.to_json``."""
        from lossless_check.outputs.report import to_json
        from lossless_check.evidence.results import RunResult

        doc = to_json(RunResult([], self.alpha, self.seed, self.samples))
        doc["cases"] = self.sorted_records()
        return doc


class Lossless:
    """The ``lossless`` fixture: run lossless-check cases from a test.

    Every check is one step-mode case at its share of the session's family-wise alpha (see the
    module docstring), recorded for the terminal summary and ``--lossless-report``.
    """

    def __init__(self, state: SessionState, nodeid: str, marker_options: dict[str, Any] | None = None):
        options = dict(marker_options or {})
        unknown = sorted(set(options) - set(MARKER_OPTIONS))
        if unknown:
            pytest.fail(f"@pytest.mark.lossless takes {', '.join(MARKER_OPTIONS)} as keyword arguments, not "
                        f"{', '.join(unknown)}", pytrace=False)
        if "seed" in options and not isinstance(options["seed"], int):
            pytest.fail(f"@pytest.mark.lossless: seed must be an integer, got {options['seed']!r}", pytrace=False)
        self._state = state
        self._nodeid = nodeid
        self._options = options
        self._seed = options.get("seed", state.seed)
        self._checks = 0

    def _samples(self, samples: int | None) -> int:
        """The check's argument, else the marker's, else ``--lossless-samples``; a bad value is a usage error."""
        from lossless_check.core.errors import UsageError

        samples = samples if samples is not None else self._options.get("samples", self._state.samples)
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
            raise UsageError(f"samples must be a positive integer, got {samples!r}")
        return samples

    def _scenario(self, scenario: str | None, default: str) -> str:
        return scenario if scenario is not None else self._options.get("scenario", default)

    def _next_alpha(self) -> float:
        self._checks += 1
        return self._state.alpha_for(self._nodeid, self._checks)

    def check(self, generator: str | type, warpers: str | dict[str, Any] = "top_k=3", scenario: str | None = None,
              samples: int | None = None) -> CaseResult:
        """Run one case and return its :class:`~lossless_check.evidence.results.CaseResult` with the verdict decided.

        ``generator`` is a built-in class name (``"DFlashTokenCandidateGenerator"``), a ``"module:attr"``
        spec, or a class importable as ``module:qualname``. ``warpers`` is a spec (``"top_k=3,temperature=0.7"``,
        ``"none"``) or a dict of ``GenerationConfig`` keyword arguments. ``scenario`` defaults to the
        marker's, else ``iid8``; ``samples`` to the marker's, else ``--lossless-samples``. Bad input raises
        :class:`lossless_check.core.errors.UsageError`.
        """
        return self._run(generator, warpers, scenario, samples)[0]

    def _run(self, generator, warpers, scenario, samples) -> tuple[CaseResult, str]:
        from lossless_check.subjects.adapters import resolve_generator
        from lossless_check.core.errors import UsageError
        from lossless_check.outputs.report import to_json
        from lossless_check.running.workers import one_thread
        from lossless_check.modes.informativeness import attach_plan, case_informative_positions
        from lossless_check.modes import run_case
        from lossless_check.evidence.results import Case, RunResult, decide
        from lossless_check.laws.scenarios import SCENARIOS
        from lossless_check.laws.warpers import parse_warpers, validate_warpers

        alpha = self._next_alpha()
        spec = _spec(generator)
        if isinstance(warpers, str):
            stack = parse_warpers(warpers)
        else:
            stack = dict(warpers)
            validate_warpers(stack)
        scenario = self._scenario(scenario, DEFAULT_SCENARIO)
        if scenario not in SCENARIOS:
            raise UsageError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
        samples = self._samples(samples)
        case = Case(resolve_generator(spec), stack, "step", SCENARIOS[scenario])
        # Fixed-sample: a failure names every failing position (a sequential stop names none).
        with one_thread():
            result = run_case(case, samples, self._seed, alpha, sequential=False)
        attach_plan(result, case, case_informative_positions(case))
        decide([result], alpha)
        record = to_json(RunResult([result], alpha, self._seed, samples))["cases"][0]
        record.update(test=self._nodeid, check=self._checks, generator_spec=spec,
                      reproduce=reproduce_command(spec, case.warper_spec, scenario, samples, self._seed, alpha))
        self._state.records.append(record)
        return result, record["reproduce"]

    def assert_lossless(self, generator: str | type, warpers: str | dict[str, Any] = "top_k=3",
                        scenario: str | None = None, samples: int | None = None, *,
                        allow_vacuous: bool = False) -> CaseResult:
        """:meth:`check`, then fail the test with a short explanation unless the verdict is ``lossless``.

        The explanation names the failed sub-checks (``support``, ``output_law@j``, ``acceptance_law``),
        the TV at each failing position, the acceptance excess over theory, the warper stack, and the
        ``lossless-check run`` command that reproduces the check. A generator missing from the
        installed transformers skips the test (not applicable there); any other check that did not run
        fails it, with why: no evidence is no pass. A ``vacuous`` check (the warper stack leaves the target a
        point mass wherever the check looked: it could not have failed on ``q``) fails too, with why,
        unless ``allow_vacuous=True`` says the caller means it (its exact checks passed); so does an
        ``inconclusive`` one (nothing rejected, but too few samples to have seen a departure of the stated
        size: the message says how many would).
        """
        from lossless_check.core.compat import ABSENT

        result, command = self._run(generator, warpers, scenario, samples)
        if result.verdict == "skipped" and ABSENT in result.reason:
            pytest.skip(result.reason)
        if result.verdict == "skipped":
            pytest.fail(f"{result.generator} was not checked under warpers [{result.warpers}] (scenario "
                        f"{result.scenario}): {result.reason}\nreproduce: {command}", pytrace=False)
        if result.verdict == "vacuous" and allow_vacuous:
            return result
        if result.verdict == "vacuous":
            pytest.fail(f"{result.generator} was not tested under warpers [{result.warpers}] (scenario "
                        f"{result.scenario}): the check is vacuous: {result.reason}; pass allow_vacuous=True "
                        f"to accept it\nreproduce: {command}", pytrace=False)
        if result.verdict != "lossless":
            pytest.fail(failure_message(result, command), pytrace=False)
        return result

    def check_models(self, target: str, assistant: str, generators=None, warpers=None, prompts: str | None = None,
                     max_new_tokens: int | None = None, samples: int | None = None, device: str = "cpu",
                     workers: int = 1):
        """Check the test's own model pair (:func:`lossless_check.check_models`) as one check of this test:
        its rows share this check's share of the session's alpha. Returns the
        :class:`~lossless_check.faces.models.ModelsResult`, recorded for the terminal summary and
        ``--lossless-report`` (one case per row, ``mode`` ``models``).

        ``samples`` is the most sampling ``generate()`` calls per row (default
        :data:`lossless_check.faces.models.DEFAULT_SAMPLES`), not ``--lossless-samples`` (trials of a step
        check); the seed is the marker's, else ``--lossless-seed``.
        """
        from lossless_check.faces.models import DEFAULT_MAX_NEW_TOKENS, DEFAULT_SAMPLES, check_models
        from lossless_check.faces.models_command import models_record, reproduce_models_command

        alpha = self._next_alpha()
        specs = None if generators is None else [_spec(g) for g in
                                                  ([generators] if isinstance(generators, (str, type)) else generators)]
        max_new_tokens = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
        samples = DEFAULT_SAMPLES if samples is None else samples
        result = check_models(target, assistant, specs, warpers, prompts, max_new_tokens, samples, alpha,
                              self._seed, device, workers)
        command = reproduce_models_command(result)
        self._state.records += [models_record(row, result, self._nodeid, self._checks, command) for row in result.rows]
        return result

    def assert_models_lossless(self, target: str, assistant: str, generators=None, warpers=None,
                               prompts: str | None = None, max_new_tokens: int | None = None,
                               samples: int | None = None, device: str = "cpu", workers: int = 1):
        """:meth:`check_models`, then fail the test unless every row is ``lossless``: the message names each
        failing generator and stack, which of the exact, statistical and greedy checks failed and by how
        much, and the ``lossless-check models`` command that repeats the check. Every row skipped because its
        generator is not in the installed transformers skips; any other row that is no pass (``inconclusive``,
        skipped for another reason) fails the test, with why."""
        from lossless_check.core.compat import ABSENT
        from lossless_check.faces.models_command import models_failure_message, reproduce_models_command

        result = self.check_models(target, assistant, generators, warpers, prompts, max_new_tokens, samples,
                                   device, workers)
        if result.rows and all(r.verdict == "skipped" and ABSENT in r.reason for r in result.rows):
            pytest.skip("; ".join(r.reason for r in result.rows))
        if result.exit_code:
            pytest.fail(models_failure_message(result, reproduce_models_command(result)), pytrace=False)
        return result

    def fuzz(self, generator: str | type, examples: int | None = None, samples: int | None = None,
             scenario: str | None = None, database: str | None = None):
        """Fuzz ``generator`` over warper stacks (:func:`lossless_check.faces.fuzzing.fuzz`: the covering of every
        option triple, then random stacks) as one check of this test: the whole search, shrinking included,
        spends this check's share of the session's alpha.

        ``examples`` (hypothesis examples of the random search per pass, after the covering's stacks) defaults
        to :data:`lossless_check.faces.fuzzing.DEFAULT_EXAMPLES`;
        ``samples`` (trials per statistical example) to the marker's, else ``--lossless-samples``;
        ``scenario`` to the marker's, else ``markov8``; ``database`` (hypothesis's example database
        directory) to ``.lossless-fuzz``. Returns a :class:`~lossless_check.faces.fuzzing.FuzzResult`, recorded
        for the terminal summary and ``--lossless-report`` (``mode`` ``fuzz``).
        """
        from lossless_check.faces import fuzzing
        from lossless_check.core.errors import UsageError

        alpha = self._next_alpha()
        spec = _spec(generator)
        if examples is None:
            examples = fuzzing.DEFAULT_EXAMPLES
        if not isinstance(examples, int) or isinstance(examples, bool) or examples < 1:
            raise UsageError(f"examples must be a positive integer, got {examples!r}")
        samples = self._samples(samples)
        scenario = self._scenario(scenario, fuzzing.DEFAULT_SCENARIO)
        result = fuzzing.fuzz(spec, examples, samples, scenario, self._seed, alpha,
                              database or fuzzing.DEFAULT_DATABASE)
        self._state.records.append(fuzz_record(result, self._nodeid, self._checks, alpha))
        return result

    def assert_fuzz_lossless(self, generator: str | type, examples: int | None = None, samples: int | None = None,
                             scenario: str | None = None, database: str | None = None):
        """:meth:`fuzz`, then fail the test with the minimal failing stack and its reproduce command."""
        result = self.fuzz(generator, examples, samples, scenario, database)
        if result.verdict != "lossless":
            pytest.fail(result.summary(), pytrace=False)
        return result


    def check_sampler(self, sampler, protocol: str | None = None, samples: int | None = None):
        """Check a rejection sampler of the test's own (:func:`lossless_check.check_sampler`: ``module:function``
        or the function) as one check of this test, at its share of the session's alpha. ``samples``: trials
        per draft/target pair of the statistical part (default: the marker's, else ``--lossless-samples``).
        Returns the :class:`~lossless_check.subjects.sampler_check.SamplerReport`, recorded for the terminal
        summary and ``--lossless-report`` (``mode`` ``sampler``)."""
        from lossless_check.faces.api import check_sampler
        from lossless_check.faces.sampler_command import sampler_record

        alpha = self._next_alpha()
        report = check_sampler(sampler, protocol, self._samples(samples), alpha, self._seed)
        self._state.records.append(sampler_record(report, self._nodeid, self._checks, alpha, self._seed))
        return report

    def assert_sampler_lossless(self, sampler, protocol: str | None = None, samples: int | None = None):
        """:meth:`check_sampler`, then fail the test unless the sampler is lossless: the message says which
        design or position failed, with the draws that show it, and the command that repeats the check."""
        report = self.check_sampler(sampler, protocol, samples)
        if not report.lossless:
            pytest.fail(f"{report.sampler} is not lossless ({report.protocol} protocol): {report.reason}\n"
                        f"reproduce: {self._state.records[-1]['reproduce']}", pytrace=False)
        return report


def _spec(generator: str | type) -> str:
    return generator if isinstance(generator, str) else f"{generator.__module__}:{generator.__qualname__}"


def fuzz_record(result, test: str, check: int, alpha: float) -> dict[str, Any]:
    """A fuzz check as a ``--lossless-report`` case (``mode`` ``fuzz``): the report's case keys where they
    mean something for a search (``warpers``: the minimal failing stack, ``tv_detectable``: the worst
    statistical example's, ``samples``: trials per example), the search's own (``examples``,
    ``stacks_checked``, ``statistical_tests``, ``alpha_spent``) and the plugin's (``test``, ``check``...)."""
    statistical = [r for r in result.records if r.get("verdict") is not None]
    detectable = [r["tv_detectable"] for r in statistical if r.get("tv_detectable") is not None]
    return {"generator": result.generator.rpartition(":")[2], "warpers": result.stack, "mode": "fuzz",
            "scenario": result.scenario, "verdict": result.verdict, "samples": result.samples, "tv": None,
            "tv_detectable": max(detectable) if detectable else None, "p_value": None,
            "acceptance_rate": None, "expected_acceptance_rate": None,
            "reason": result.reason or result.summary(), "alpha_case": alpha, "examples": result.examples,
            "stacks_checked": sum(not r["vacuous"] for r in result.records),
            "statistical_tests": len(statistical), "alpha_spent": result.alpha_spent,
            "seconds": result.seconds, "test": test, "check": check, "generator_spec": result.generator,
            "reproduce": result.reproduce}
