"""The case and result model: what a run checks (:class:`Case`) and what it concludes.

A :class:`CaseResult` is one row of the JSON report; :class:`RunResult` holds a run's rows with the
family-wise decision applied (:func:`decide`, Holm across the statistical cases).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lossless_check.laws.scenarios import DEFAULT, Scenario
from lossless_check.laws.warpers import format_warpers
from lossless_check.stats import holm_correction

#: Power at which ``tv_detectable`` is stated.
POWER = 0.99
#: Checks that fail on a single impossible event, whatever the sample size.
EXACT_CHECKS = ("support", "impossible_draft", "stopping", "provenance")
#: Said of a case (or fuzz stack) whose exact provenance pass was blind, passing or not: provenance
#: could not trace its drafts to the draws that made them (an interception gap).
BLIND = ("exact pass blind: provenance could not see how the drafts were sampled (interception gap), so only the "
         "statistical tests checked q")
#: Verdicts, in the order reports list them. ``vacuous``: the case could not reveal a bug in ``q``
#: (:mod:`~lossless_check.modes.informativeness`); only its exact checks ran, and they passed. ``inconclusive``:
#: its tests ran and rejected nothing, but could not have seen a departure of the run's stated size
#: (:data:`DEFAULT_MAX_DETECTABLE_TV`): not a pass. ``unfinished``: only in the report of an interrupted run.
VERDICTS = ("not_lossless", "error", "inconclusive", "vacuous", "lossless", "skipped", "unfinished")
#: The largest ``tv_detectable`` (at power :data:`POWER`, at an informative position) a statistical case may state
#: and still read ``lossless``: a case that could not have seen a departure of this total variation is
#: ``inconclusive``. It is the figure the default gate's slowest mode reaches (generate mode, 400 calls:
#: 0.20-0.28 on markov8); the bug classes the project has met depart by TV 0.09-0.76 at their failing
#: position. ``--max-detectable-tv`` sets it per run.
DEFAULT_MAX_DETECTABLE_TV = 0.3


@dataclass(frozen=True)
class Case:
    """One generator under one warper stack in one mode, on one scenario.

    ``generator`` is a :class:`~lossless_check.subjects.adapters.ResolvedGenerator`; ``max_new_tokens`` is
    the number of tokens each ``generate()`` call emits in generate mode (unused elsewhere); ``sampler``
    (a :class:`~lossless_check.subjects.sampler.Sampler`) runs in place of the installed
    ``_speculative_sampling`` (``run --sampler``; ``None``: the installed one).
    ``torch_draws``: step mode draws every token with torch's kernel (:mod:`~lossless_check.modes.interception`).
    """

    generator: Any
    warpers: dict[str, Any]
    mode: str = "step"
    scenario: Scenario = DEFAULT
    max_new_tokens: int = 4
    sampler: Any = None
    torch_draws: bool = False

    @property
    def warper_spec(self) -> str:
        return format_warpers(self.warpers)

    @property
    def key(self) -> str:
        """Identity of the case in seeds and caches: a function of what it checks, nothing else."""
        key = f"{self.generator.spec}|{self.warper_spec}|{self.mode}|{self.scenario.name}"
        key += f"|K={self.max_new_tokens}" if self.mode == "generate" else ""
        return (key + (f"|sampler={self.sampler.spec}" if self.sampler is not None else "")
                + ("|torch-draws" if self.torch_draws else ""))

    def result(self, **fields) -> "CaseResult":
        """An empty result row for this case."""
        return CaseResult(self.generator.display_name, self.warper_spec, self.mode, self.scenario.name, **fields)


@dataclass
class CaseResult:
    """A case's statistics and verdict (the JSON report's ``cases`` entries)."""

    generator: str
    warpers: str
    mode: str
    scenario: str
    verdict: str = "lossless"
    samples: int = 0
    tv: float | None = None
    tv_ci: tuple[float, float] | None = None
    tv_detectable: float | None = None
    p_value: float | None = None
    p_value_adjusted: float | None = None
    alpha_case: float | None = None
    alpha_family: float | None = None  # the run's family-wise rate Holm decided the case at
    chi2: float | None = None
    chi2_dof: int | None = None
    chi2_p_value: float | None = None
    g_p_value: float | None = None
    acceptance_rate: float | None = None
    expected_acceptance_rate: float | None = None
    acceptance_law: list[float] | None = None
    expected_acceptance_law: list[float] | None = None
    acceptance_p_value: float | None = None
    acceptance_statistic: float | None = None  # TV between the observed and theoretical n_matches laws
    empirical_law: list[float] | None = None  # the first failing position (else position 1)
    expected_law: list[float] | None = None
    law_position: int | None = None  # the position empirical_law and expected_law describe
    provenance: dict | None = None  # provenance sub-verdict (modes provenance and all)
    log_e_value: float | None = None  # sequential runs: natural log of the largest anytime e-value seen
    batch: dict | None = None  # step mode: how trials were batched (batch size, why, batch-1 replays)
    generator_facts: dict | None = None  # step mode: what the generator was built with (Universal's shared ids)
    # Positions whose trials met a law that is not a point mass: the ones carrying evidence about q
    # (None: no law test, e.g. a greedy reference). Empty: the case is vacuous.
    informative_positions: list[int] | None = None
    # Positions informative by the exact laws alone, known before running (empty: no alpha share).
    law_informative_positions: list[int] | None = None
    failed_checks: list[str] = field(default_factory=list)  # checks that make the verdict not_lossless
    # Checks that assume the drafter samples the processed drafter table (acceptance law, rejection
    # residuals): they explain a failure but do not define one, since any honest q is lossless.
    diagnostics: list[str] = field(default_factory=list)
    positions: list[dict] = field(default_factory=list)
    reason: str = ""
    seconds: float = 0.0
    samples_per_second: float | None = None
    exact_failure: bool = False
    # Every exact failure with its cause (:mod:`lossless_check.evidence.attribution`): ``{"check", "cause":
    # "verifier" | "generator", "position", "trials", ...}``; verifier-caused trials are set aside.
    exact_failures: list[dict] = field(default_factory=list)
    verifier_set_aside: int = 0
    subject: bool = True  # False: a row beside the run's subjects (the verifier's, for named generators)
    # Greedy mode: what was compared with plain greedy decoding, what the loop did, the first difference.
    greedy_equivalence: dict | None = None
    # The user's sampler (module:function) that replaced the installed _speculative_sampling (run --sampler).
    sampler: str | None = None
    # The run's bar (decide()): a statistical case reads lossless only if it states power at or below it.
    max_detectable_tv: float | None = None
    # Step mode: draws made by inverse CDF, not torch.multinomial, in the trials the verdict rests on ({"verifier":
    # .., "batched_drafts": ..}: modes/interception.py; 0 with torch_draws). None: a mode that substitutes none.
    substituted_draws: dict | None = None

    @property
    def detectable(self) -> tuple[int, float] | None:
        """The informative position with the smallest stated ``tv_detectable`` and that figure (``None``: no
        informative position states one, e.g. a batched case informative past position 1 only)."""
        informative = self.informative_positions or [1]
        stated = [(p["tv_detectable"], p["position"]) for p in self.positions
                  if p.get("position") in informative and p.get("tv_detectable") is not None]
        if not self.positions and self.tv_detectable is not None:
            stated = [(self.tv_detectable, 1)]
        if not stated:
            return None
        tv, position = min(stated)
        return position, tv

    @property
    def exact_pass_blind(self) -> bool:
        """Whether this case's exact provenance pass ran and could not see the sampler (a ``gap``)."""
        return bool(self.provenance) and self.provenance.get("verdict") == "gap"

    @property
    def vacuous(self) -> bool:
        """Whether no ``q`` could change what this case tested (before running, or in its trials)."""
        return self.law_informative_positions == [] or self.informative_positions == []

    def _evidence(self) -> str:
        """Where the evidence is: why a case is vacuous, or which positions a partly informative one rests on."""
        tested = len(self.positions)
        if self.law_informative_positions == []:
            return (f"the processed target is a point mass at every reachable prefix of positions 1-{tested}: "
                    f"no q can change the output law; only the exact checks ran")
        if self.informative_positions == []:
            return (f"no trial reached a prefix where the processed target is not a point mass (by the laws: "
                    f"{_positions(self.law_informative_positions or [])}, reached only through drafts the target "
                    f"accepts): no evidence about q; only the exact checks ran")
        if self.informative_positions is not None and len(self.informative_positions) < tested:
            return (f"evidence from {_positions(self.informative_positions)} only "
                    f"(every law met elsewhere is a point mass)")
        return ""

    def explain(self) -> str:
        """One-line reason for the verdict."""
        if self.verdict in ("error", "skipped") or self.mode in ("verifier", "greedy", "options"):  # exact: the reason
            return self.reason
        parts = []
        evidence = self._evidence()
        if self.verdict == "vacuous":
            parts.append(evidence)
        if "support" in self.failed_checks:
            parts.append("emitted a token the target gives probability 0")
        if "impossible_draft" in self.failed_checks:
            parts.append("drafted a token its returned q gives probability 0")
        if "e_value" in self.failed_checks:
            strongest = max(self.positions, key=lambda p: p.get("log_e_value", -1e300))["position"]
            level = math.log(2.0 / self.alpha_case)
            parts.append(f"sequential e-value test rejects, e-value {compared(self.log_e_value, level, '>=', 'e^', '.1f')}"
                         f" = 2/alpha after {self.samples} trials "
                         f"(most evidence at position {strongest})")
        bad = [p for p in self.positions if f"output_law@{p['position']}" in self.failed_checks]
        for p in bad:
            if "e_value" in self.failed_checks:  # stopped early: the evidence is the position's e-value
                parts.append(f"output law at position {p['position']}: sequential e-value e^{p['log_e_value']:.1f}, "
                             f"TV {p['tv']:.4f} (n={p['samples']})")
                continue
            parts.append(f"output law at position {p['position']}: {law_test_sentence(p)}")
        if self.verdict == "not_lossless" and not parts and not self.exact_failure:
            # Holm rejected the case's combined p-value without any single check at its own level.
            worst = min(self.positions, key=lambda p: p["p_value"]) if self.positions else None
            where = f"; smallest at position {worst['position']} (TV {worst['tv']:.4f})" if worst else ""
            parts.append(f"combined p-value {self.p_value:.2g}, Holm-adjusted "
                         f"{compared(self.p_value_adjusted, self.alpha_family, '<=', '', '.2g')} = family alpha{where}")
        if self.verdict == "inconclusive":
            parts.append(self._inconclusive())
        if self.verdict == "lossless" and not parts and self.tv is not None:
            first = (self.informative_positions or [1])[0]
            at = self.positions[first - 1] if self.positions else {}
            # Above 4096 tokens the laws are tested on cells: the figure is a TV between cell laws.
            cells = f" on {at['tested_on']}" if at.get("tested_on", "tokens") != "tokens" else ""
            if first == 1:
                parts.append(f"TV {self.tv:.4f}; would detect TV >= {self.tv_detectable:.4f}{cells} with power {POWER}")
            elif at["tv_detectable"] is None:  # a batched case states nothing past position 1 (modes/step.py)
                parts.append(f"TV {at['tv']:.4f} at position {first}; no detectable TV is stated there for "
                             f"batch-1 calls (batched rows only)")
            else:
                parts.append(f"TV {at['tv']:.4f} at position {first}; would detect TV >= {at['tv_detectable']:.4f}"
                             f"{cells} there with power {POWER}")
        if evidence and self.verdict != "vacuous":
            parts.append(evidence)
        aside = [e for e in self.exact_failures if e["cause"] == "verifier"]
        if aside:
            parts.append(f"{self.verifier_set_aside} trials set aside, caused by the verifier: it accepted a draft the "
                         f"target gives probability 0 ({aside[0]['where'].rsplit('/', 1)[-1]} `{aside[0]['rule']}`, "
                         f"probability 2^-24 per such draft); the verdict rests on the other trials")
        if self.expected_acceptance_rate is None and self.acceptance_rate is not None:
            parts.append(f"acceptance rate {self.acceptance_rate:.3f} (no theory: drafts of varying length, or no q)")
        if self.expected_acceptance_rate is not None:
            excess = self.acceptance_rate - self.expected_acceptance_rate
            flag = " (acceptance law differs from theory)" if "acceptance_law" in self.diagnostics else ""
            residuals = [c for c in self.diagnostics if c.startswith("residual@")]
            if residuals:
                flag += f" (rejection residual differs at {', '.join(r.split('@')[1] for r in residuals)})"
            parts.append(
                f"acceptance rate {self.acceptance_rate:.3f} vs theory {self.expected_acceptance_rate:.3f} "
                f"({excess:+.3f}){flag}"
            )
        return "; ".join(parts)

    def _inconclusive(self) -> str:
        """Why a case that rejected nothing is no pass, and what would make it one."""
        bar = self.max_detectable_tv
        where = self.detectable
        if where is None:
            return (f"inconclusive: no rejection, but no power is stated at the informative positions "
                    f"{', '.join(map(str, self.informative_positions or []))} (batched rows state none past position 1 for "
                    f"batch-1 calls): it could not have been shown to see a departure of TV {bar:g}; --batch-size 1 "
                    f"states it")
        position, tv = where
        # Every detectable TV here scales as 1/sqrt(n) (concentration bounds): the trials that reach the bar.
        needed = math.ceil(self.samples * (tv / bar) ** 2) if self.samples else None
        more = f"; about {needed} trials would" if needed else ""
        seen = f" (TV {self.tv:.4f})" if self.tv is not None else ""
        at = next((p for p in self.positions if p.get("position") == position), {})
        # Above 4096 tokens the laws are tested on cells: the figure is a TV between cell laws.
        cells = f" on {at['tested_on']}" if at.get("tested_on", "tokens") != "tokens" else ""
        return (f"inconclusive: no rejection in {self.samples} trials{seen}, but it detects only "
                f"TV >= {tv:.4f}{cells} at position {position} with power {POWER}, above the stated {bar:g}{more}")

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        out.pop("exact_failure")
        if self.tv_ci is not None:
            out["tv_ci"] = list(self.tv_ci)
        return out


def law_test_sentence(p: dict) -> str:
    """Which half of a position's verdict test rejected, with a true statement about its statistic."""
    said = []
    if "l1" in p.get("rejected_by", ()):
        said.append(f"L1 test rejects, TV {compared(p['tv'], p['tv_threshold'], '>', '', '.4f')} threshold "
                    f"(p={compared(p['l1_p_value'], p['l1_alpha'], '<=', '', '.2g')})")
    if "lr" in p.get("rejected_by", ()):
        said.append(f"likelihood-ratio test rejects, e-value e^{p['lr_log_e_value']:.1f} "
                    f"(p={compared(p['lr_p_value'], p['lr_alpha'], '<=', '', '.2g')}; TV {p['tv']:.4f})")
    return "; ".join(said) + f" (n={p['samples']})"


def compared(a: float, b: float, relation: str, prefix: str, spec: str) -> str:
    """``"{a} {relation} {b}"``, with as many digits as it takes for the printed numbers to show the
    relation (``0.04391 > 0.04389`` must not print as ``0.0439 > 0.0439``)."""
    kind, digits = spec[-1], int(spec[1:-1])
    for more in range(0, 9):
        left, right = (format(v, f".{digits + more}{kind}") for v in (a, b))
        if left != right or a == b:
            break
    return f"{prefix}{left} {relation} {prefix}{right}"


@dataclass
class RunResult:
    """All cases of a run, with the family-wise decision applied."""

    cases: list[CaseResult]
    alpha_family: float
    seed: int
    samples: int
    interrupted: bool = False  # SIGINT/SIGTERM: the decision covers the finished cases only
    workers_lost: list[dict] = field(default_factory=list)  # tasks a lost worker cost (running.worker_loss)

    @property
    def subjects(self) -> list[CaseResult]:
        """The rows the run was asked about (``subject`` true): they decide the exit code."""
        return [c for c in self.cases if c.subject]

    @property
    def beside(self) -> list[CaseResult]:
        """Rows reported beside the subjects and never deciding the exit code: the installed verifier's
        row in a run whose subjects are named generators."""
        return [c for c in self.cases if not c.subject]

    @property
    def exit_code(self) -> int:
        """1 a subject not lossless or a generator error; else 5 (no answer) when a subject was not checked
        (every case of it skipped, vacuous or unfinished: :meth:`unchecked`) or a case is ``inconclusive``;
        else 0. Rows reported beside the subjects do not count.

        A generator that raises or returns malformed output is a finding about the generator, so it
        exits 1 like a not-lossless case; 3 is reserved for the harness's own bugs (raised, never a verdict).
        """
        from lossless_check.core.exit_codes import exit_code_for

        return exit_code_for(self._by_subject())

    def _by_subject(self) -> dict[str, list[str]]:
        verdicts: dict[str, list[str]] = {}
        for c in self.subjects:
            verdicts.setdefault(c.generator, []).append(c.verdict)
        return verdicts

    def unchecked(self) -> dict[str, str]:
        """Subjects none of whose cases was checked, each with why (its cases' verdicts and reasons)."""
        from lossless_check.core.exit_codes import CHECKED

        from collections import Counter

        out = {}
        for name, verdicts in self._by_subject().items():
            if not set(verdicts) & set(CHECKED):
                reasons = Counter(f"{c.verdict} ({c.mode}): {c.reason}" for c in self.subjects if c.generator == name)
                out[name] = "; ".join(f"{n} x {why}" if n > 1 else why for why, n in reasons.items())
        return out

    def counts(self) -> dict[str, int]:
        """Subjects per verdict."""
        return {v: sum(c.verdict == v for c in self.subjects) for v in VERDICTS}


def decide(results: list[CaseResult], alpha_family: float,
           max_detectable_tv: float = DEFAULT_MAX_DETECTABLE_TV) -> None:
    """Holm across the tested cases: verdicts controlling the family-wise false-failure rate.

    A tested case that rejects nothing reads ``lossless`` only where it could have seen a departure of
    total variation ``max_detectable_tv`` (its :attr:`CaseResult.detectable` figure, power :data:`POWER`);
    otherwise ``inconclusive``. The bar changes no p-value and no rejection: the false-failure rate is
    untouched, only what a pass claims.

    The family is every case that ran and was given a share of the alpha: a case vacuous by the laws
    (``law_informative_positions == []``, known before it ran) is not in it. A case that turns out
    vacuous in its trials stays in the family (its membership may not depend on its data; its p-value
    is 1, so it only makes Holm more conservative). A vacuous case is ``vacuous`` unless an exact
    check failed (``not_lossless``); it never reads ``lossless``.
    """
    ran = [r for r in results if r.p_value is not None and r.verdict not in ("error", "skipped", "unfinished")]
    tested = [r for r in ran if r.law_informative_positions != []]
    adjusted = holm_correction([r.p_value for r in tested])
    for r, adj in zip(tested, adjusted):
        r.p_value_adjusted, r.alpha_family = float(adj), alpha_family
        r.verdict = "not_lossless" if (r.exact_failure or adj <= alpha_family) else "lossless"
        # Checks flagged at the Bonferroni level stand when Holm rejects; a lossless verdict has none.
        if r.verdict == "lossless":
            r.failed_checks = []
            r.max_detectable_tv = max_detectable_tv
            where = r.detectable
            # informative_positions None: no law test (a greedy reference, a point mass: every departure is exact).
            if r.informative_positions is not None and not r.vacuous and (where is None or where[1] > max_detectable_tv):
                r.verdict = "inconclusive"
    for r in ran:
        if r.vacuous:
            r.verdict = "not_lossless" if r.exact_failure else "vacuous"
            r.failed_checks = [c for c in r.failed_checks if c in EXACT_CHECKS]
            r.tv_detectable = None  # nothing there to detect
            if r.law_informative_positions == []:  # no share of alpha, no statistical claim
                r.p_value = r.p_value_adjusted = None
                r.alpha_case = 0.0
        r.reason = r.explain()


def _positions(positions: list[int]) -> str:
    return ("position " if len(positions) == 1 else "positions ") + ", ".join(map(str, positions))


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for reasons in reports."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
