"""The case and result model: what a run checks (:class:`Case`) and what it concludes.

A :class:`CaseResult` is one row of the JSON report; :class:`RunResult` holds a run's rows with the
family-wise decision applied (:func:`decide`, Holm across the statistical cases).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .scenarios import DEFAULT, Scenario
from .stats import holm_correction
from .warpers import format_warpers

#: Power at which ``tv_detectable`` is stated.
POWER = 0.99
#: Checks that fail on a single impossible event, whatever the sample size.
EXACT_CHECKS = ("support", "impossible_draft", "stopping", "provenance")
#: Verdicts, in the order reports list them.
VERDICTS = ("not_lossless", "error", "lossless", "skipped")


@dataclass(frozen=True)
class Case:
    """One generator under one warper stack in one mode, on one scenario.

    ``generator`` is a :class:`~lossless_check.adapters.ResolvedGenerator`; ``max_new_tokens`` is
    the number of tokens each ``generate()`` call emits in generate mode (unused elsewhere).
    """

    generator: Any
    warpers: dict[str, Any]
    mode: str = "step"
    scenario: Scenario = DEFAULT
    max_new_tokens: int = 4

    @property
    def warper_spec(self) -> str:
        return format_warpers(self.warpers)

    @property
    def key(self) -> str:
        """Identity of the case in seeds and caches: a function of what it checks, nothing else."""
        key = f"{self.generator.spec}|{self.warper_spec}|{self.mode}|{self.scenario.name}"
        return key + (f"|K={self.max_new_tokens}" if self.mode == "generate" else "")

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
    batch: dict | None = None  # step mode: how trials were batched (arms, batch size, two-sample test)
    # Step mode: what the generator was built with that the run does not choose (Universal: the
    # assistant ids of the shared words in the order its translator's pruned head holds them).
    generator_facts: dict | None = None
    failed_checks: list[str] = field(default_factory=list)  # checks that make the verdict not_lossless
    # Checks that assume the drafter samples the processed drafter table (acceptance law, rejection
    # residuals): they explain a failure but do not define one, since any honest q is lossless.
    diagnostics: list[str] = field(default_factory=list)
    positions: list[dict] = field(default_factory=list)
    reason: str = ""
    seconds: float = 0.0
    samples_per_second: float | None = None
    exact_failure: bool = False
    # Every exact failure with its cause (:mod:`lossless_check.attribution`): ``{"check", "cause":
    # "verifier" | "generator", "position", "trials", ...}``; verifier-caused trials are set aside.
    exact_failures: list[dict] = field(default_factory=list)
    verifier_set_aside: int = 0

    def explain(self) -> str:
        """One-line reason for the verdict."""
        if self.verdict in ("error", "skipped") or self.mode == "verifier":
            return self.reason
        parts = []
        if "support" in self.failed_checks:
            parts.append("emitted a token the target gives probability 0")
        if "impossible_draft" in self.failed_checks:
            parts.append("drafted a token its returned q gives probability 0")
        if "e_value" in self.failed_checks:
            strongest = max(self.positions, key=lambda p: p.get("log_e_value", -1e300))["position"]
            parts.append(f"anytime e-value e^{self.log_e_value:.1f} >= 2/alpha after {self.samples} trials "
                         f"(most evidence at position {strongest})")
        if "batch_consistency" in self.failed_checks:
            parts.append(f"batched rows and batch-1 rows follow different laws ({self.batch['reason']})")
        bad = [p for p in self.positions if f"output_law@{p['position']}" in self.failed_checks]
        for p in bad:
            if "e_value" in self.failed_checks:  # stopped early: the evidence is the position's e-value
                parts.append(f"output law at position {p['position']}: e-value e^{p['log_e_value']:.1f}, "
                             f"TV {p['tv']:.4f} (n={p['samples']})")
                continue
            parts.append(
                f"output law at position {p['position']}: TV {p['tv']:.4f} > threshold {p['tv_threshold']:.4f} "
                f"(p={p['p_value']:.2g}, n={p['samples']})"
            )
        if self.verdict == "not_lossless" and not parts and not self.exact_failure:
            # Holm rejected the case's combined p-value without any single check at its own level.
            worst = min(self.positions, key=lambda p: p["p_value"]) if self.positions else None
            where = f"; smallest at position {worst['position']} (TV {worst['tv']:.4f})" if worst else ""
            parts.append(f"combined p-value {self.p_value:.2g} <= family alpha after Holm{where}")
        if self.verdict == "lossless" and not parts and self.tv is not None:
            parts.append(f"TV {self.tv:.4f}; would detect TV >= {self.tv_detectable:.4f} with power {POWER}")
        aside = [e for e in self.exact_failures if e["cause"] == "verifier"]
        if aside:
            parts.append(f"{self.verifier_set_aside} trials set aside, caused by the verifier: it accepted a draft the "
                         f"target gives probability 0 ({aside[0]['where'].rsplit('/', 1)[-1]} `{aside[0]['rule']}`, "
                         f"probability 2^-24 per such draft); the verdict rests on the other trials")
        if self.expected_acceptance_rate is None and self.acceptance_rate is not None:
            parts.append(f"acceptance rate {self.acceptance_rate:.3f} (no theory: drafts of varying length)")
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

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        out.pop("exact_failure")
        if self.tv_ci is not None:
            out["tv_ci"] = list(self.tv_ci)
        return out


@dataclass
class RunResult:
    """All cases of a run, with the family-wise decision applied."""

    cases: list[CaseResult]
    alpha_family: float
    seed: int
    samples: int

    @property
    def exit_code(self) -> int:
        """0 every case lossless (or skipped); 1 a case not lossless or a generator error.

        A generator that raises or returns malformed output is a finding about the generator, so it
        exits 1 like a not-lossless case; 3 is reserved for the harness's own bugs (raised, never a
        verdict).
        """
        return 1 if any(c.verdict in ("not_lossless", "error") for c in self.cases) else 0

    def counts(self) -> dict[str, int]:
        """Cases per verdict."""
        return {v: sum(c.verdict == v for c in self.cases) for v in VERDICTS}


def decide(results: list[CaseResult], alpha_family: float) -> None:
    """Holm across the tested cases: verdicts controlling the family-wise false-failure rate."""
    tested = [r for r in results if r.p_value is not None and r.verdict not in ("error", "skipped")]
    adjusted = holm_correction([r.p_value for r in tested])
    for r, adj in zip(tested, adjusted):
        r.p_value_adjusted = float(adj)
        r.verdict = "not_lossless" if (r.exact_failure or adj <= alpha_family) else "lossless"
        # Checks flagged at the Bonferroni level stand when Holm rejects; a lossless verdict has none.
        if r.verdict == "lossless":
            r.failed_checks = []
        r.reason = r.explain()


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``, for reasons in reports."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
