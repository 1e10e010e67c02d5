"""Step mode: one verification round per trial, through the real generator and the real verifier.

Per trial, as ``_assisted_decoding`` does: ``get_candidates()``; the target's logits for every
candidate position, processed by the real ``LogitsProcessorList`` with the candidate prefix as
history; the installed ``_speculative_sampling``. The emitted tokens and ``n_matches`` are recorded
and compared with the exact laws.

What is tested per case (one hypothesis: "this round is lossless"):

- *support* (exact): no emitted token has target probability 0, and no draft token has
  probability 0 under the ``candidate_logits`` returned with it;
- *output law at every position* ``j = 1..gamma+1``: among trials that reached ``j`` (all earlier
  drafts accepted), the ``j``-th emitted token follows ``p_j(. | prefix)``. This holds for a
  correct round whatever the drafter does, and it is what losslessness means position by position.
  The ``gamma + 1`` position tests are combined by Bonferroni into the case's p-value.

The acceptance law (``n_matches`` over ``0..gamma``, from ``a_i = sum min(p_i, q_i)`` with the
processed drafter table as ``q``) is a diagnostic: it says whether the drafter samples from the
``q`` a correct generator would use, which explains failures but does not define them.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing
import signal
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from scipy.special import logsumexp

from .adapters import DraftContext, ResolvedGenerator
from .compat import speculative_sampling
from .errors import GeneratorFailure, NotApplicable
from .expected import ExactLaws
from .scenarios import DEFAULT, Scenario
from .stats import (Stratum, bonferroni_min, holm_correction, law_test, mixture_log_evalues,
                    tv_confidence_interval)
from .stubs import fixed_logits_lm
from .warpers import capture_processors, format_warpers

#: Power at which ``tv_detectable`` is stated.
POWER = 0.99
#: Checks that fail on a single impossible event, whatever the sample size.
EXACT_CHECKS = ("support", "impossible_draft")
#: ``max_new_tokens`` of the generation config in step mode: far enough that no candidate is cut.
STEP_MAX_NEW_TOKENS = 64


@dataclass(frozen=True)
class Case:
    """One generator under one warper stack in one mode, on one scenario."""

    generator: ResolvedGenerator
    warpers: dict[str, Any]
    mode: str = "step"
    scenario: Scenario = DEFAULT

    @property
    def warper_spec(self) -> str:
        return format_warpers(self.warpers)

    @property
    def key(self) -> str:
        return f"{self.generator.spec}|{self.warper_spec}|{self.mode}|{self.scenario.name}"


#: Trials per work unit once a case is past its first few hundred trials. Each chunk has its own
#: seed, so results do not depend on the worker count.
CHUNK = 1000
#: The first chunks are smaller, so that a sequential run looks early (a bug is often caught within
#: a few hundred trials) and a fixed run with the same seed sees the same trials.
FIRST_CHUNKS = (125, 125, 250, 500)


def case_seed(seed: int, case: Case, chunk: int = 0) -> int:
    """Seed of one chunk of a case's trials: a function of the run seed, the case and the chunk alone."""
    digest = hashlib.sha256(f"{seed}|{case.key}|{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def chunk_sizes(samples: int) -> list[int]:
    """Sizes of a case's chunks: :data:`FIRST_CHUNKS`, then :data:`CHUNK` each, the last one cut."""
    sizes, total = [], 0
    while total < samples:
        size = min(FIRST_CHUNKS[len(sizes)] if len(sizes) < len(FIRST_CHUNKS) else CHUNK, samples - total)
        sizes.append(size)
        total += size
    return sizes


@dataclass
class Observations:
    """What step-mode trials emitted. ``emitted[t, j]`` is -1 past the end of trial ``t``;
    ``drafts[t]`` is its draft length (a drafter may stop early, at EOS); ``impossible[t]`` counts
    its drafts that their returned q gives probability 0."""

    emitted: np.ndarray
    n_matches: np.ndarray
    drafts: np.ndarray
    impossible: np.ndarray
    seconds: float

    @property
    def gamma(self) -> int:
        """The longest draft."""
        return self.emitted.shape[1] - 1

    @property
    def impossible_drafts(self) -> int:
        return int(self.impossible.sum())

    @classmethod
    def concatenate(cls, parts: list["Observations"]) -> "Observations":
        width = max(p.emitted.shape[1] for p in parts)
        return cls(
            np.concatenate([_widen(p.emitted, width) for p in parts]),
            np.concatenate([p.n_matches for p in parts]),
            np.concatenate([p.drafts for p in parts]),
            np.concatenate([p.impossible for p in parts]),
            sum(p.seconds for p in parts),
        )

    def head(self, trials: int) -> "Observations":
        """The first ``trials`` trials (the seconds scaled to them)."""
        return Observations(self.emitted[:trials], self.n_matches[:trials], self.drafts[:trials],
                            self.impossible[:trials], self.seconds * trials / len(self.n_matches))


def _widen(emitted: np.ndarray, width: int) -> np.ndarray:
    """``emitted`` padded with -1 (nothing emitted) to ``width`` columns."""
    return np.pad(emitted, ((0, 0), (0, width - emitted.shape[1])), constant_values=-1)


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
    empirical_law: list[float] | None = None  # position 1
    expected_law: list[float] | None = None  # position 1
    provenance: dict | None = None  # provenance sub-verdict (modes provenance and all)
    log_e_value: float | None = None  # sequential runs: natural log of the largest anytime e-value seen
    failed_checks: list[str] = field(default_factory=list)  # checks that make the verdict not_lossless
    # Checks that assume the drafter samples the processed drafter table (acceptance law, rejection
    # residuals): they explain a failure but do not define one, since any honest q is lossless.
    diagnostics: list[str] = field(default_factory=list)
    positions: list[dict] = field(default_factory=list)
    reason: str = ""
    seconds: float = 0.0
    samples_per_second: float | None = None
    exact_failure: bool = False

    def explain(self) -> str:
        """One-line reason for the verdict."""
        parts = []
        if "support" in self.failed_checks:
            parts.append("emitted a token the target gives probability 0")
        if "impossible_draft" in self.failed_checks:
            parts.append("drafted a token its returned q gives probability 0")
        if "e_value" in self.failed_checks:
            strongest = max(self.positions, key=lambda p: p["log_e_value"])["position"]
            parts.append(f"anytime e-value e^{self.log_e_value:.1f} >= 2/alpha after {self.samples} trials "
                         f"(most evidence at position {strongest})")
        bad = [p for p in self.positions if f"output_law@{p['position']}" in self.failed_checks]
        for p in bad:
            parts.append(
                f"output law at position {p['position']}: TV {p['tv']:.4f} > threshold {p['tv_threshold']:.4f} "
                f"(p={p['p_value']:.2g}, n={p['samples']})"
            )
        if self.verdict == "lossless" and not parts:
            parts.append(f"TV {self.tv:.4f}; would detect TV >= {self.tv_detectable:.4f} with power {POWER}")
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


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def check_candidates(input_ids, candidate_ids, candidate_logits, vocab_size: int, max_length: int) -> None:
    """Raise :class:`GeneratorFailure` if a generator's output is malformed."""
    if not isinstance(candidate_ids, torch.Tensor) or candidate_ids.dim() != 2 or candidate_ids.shape[0] != 1:
        shape = tuple(candidate_ids.shape) if isinstance(candidate_ids, torch.Tensor) else type(candidate_ids).__name__
        raise GeneratorFailure(f"candidate_input_ids must be a (1, length) tensor, got {shape}")
    length = input_ids.shape[1]
    if candidate_ids.shape[1] < length or not torch.equal(candidate_ids[:, :length].cpu(), input_ids.cpu()):
        raise GeneratorFailure("candidate_input_ids does not start with the input_ids it was given")
    if candidate_ids.shape[1] > max_length:
        raise GeneratorFailure(f"candidates run past max_length ({candidate_ids.shape[1]} > {max_length})")
    new = candidate_ids[0, length:]
    if bool(((new < 0) | (new >= vocab_size)).any()):
        raise GeneratorFailure(f"candidate token outside the vocabulary [0, {vocab_size})")
    if candidate_logits is None:
        return
    gamma = candidate_ids.shape[1] - length
    if not isinstance(candidate_logits, torch.Tensor) or tuple(candidate_logits.shape) != (1, gamma, vocab_size):
        shape = tuple(candidate_logits.shape) if isinstance(candidate_logits, torch.Tensor) else "not a tensor"
        raise GeneratorFailure(f"candidate_logits has shape {shape}, expected {(1, gamma, vocab_size)}")
    # One reduction on the common path: a row's max is finite unless the row holds NaN or +inf,
    # or is -inf everywhere.
    if bool(torch.isfinite(candidate_logits.amax(dim=-1)).all()):
        return
    if torch.isnan(candidate_logits).any():
        raise GeneratorFailure("candidate_logits contains NaN")
    if torch.isposinf(candidate_logits).any():
        raise GeneratorFailure("candidate_logits contains +inf")
    raise GeneratorFailure("candidate_logits has a row that is -inf everywhere")


class StepCase:
    """Builds the stubs, the processors and the real generator of one case; runs its trials."""

    def __init__(self, case: Case):
        self.case = case
        scenario = case.scenario
        self.prompt_ids = torch.tensor([scenario.prompt], dtype=torch.long)
        self.target = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
        self.processors, self.generation_config = capture_processors(
            self.target, self.prompt_ids, case.warpers, STEP_MAX_NEW_TOKENS
        )
        self.laws = ExactLaws(scenario, self.processors)
        self.verify = speculative_sampling()
        self._target_logits: dict[tuple[int, ...], torch.Tensor] = {}

    def target_logits(self, candidate_ids: torch.Tensor) -> torch.Tensor:
        """The verifier's ``new_logits``: the target's logits at every candidate position, each
        processed by the real processors with the candidate prefix as history, as ``_assisted_decoding``
        computes them.

        They are a deterministic function of the candidate sequence (fixed tables, deterministic
        processors), and a small vocabulary has few distinct sequences: each is computed once per
        case and process, and the verifier gets a fresh copy every trial.
        """
        key = tuple(candidate_ids[0].tolist())
        cached = self._target_logits.get(key)
        if cached is None:
            cached = self._target_logits[key] = self.processed_target_logits(candidate_ids)
        return cached.clone()

    def processed_target_logits(self, candidate_ids: torch.Tensor) -> torch.Tensor:
        """:meth:`target_logits` computed afresh: the target's forward pass, then the processors."""
        length, gamma = self.prompt_ids.shape[1], candidate_ids.shape[1] - self.prompt_ids.shape[1]
        logits = self.target(candidate_ids).logits[:, -gamma - 1 :].to(torch.float32)
        for i in range(gamma + 1):
            logits[:, i, :] = self.processors(candidate_ids[:, : length + i], logits[:, i, :])
        return logits

    def context(self) -> DraftContext:
        return DraftContext(
            scenario=self.case.scenario,
            generator_class=self.case.generator.generator_class,
            generation_config=self.generation_config,
            processors=self.processors,
            target=self.target,
            prompt_ids=self.prompt_ids,
        )

    def collect(self, samples: int, seed: int, progress: Callable[[int], None] | None = None) -> Observations:
        torch.manual_seed(seed)
        scenario = self.case.scenario
        vocab, prompt = scenario.vocab_size, self.prompt_ids
        length = prompt.shape[1]
        max_length = self.generation_config.max_length
        try:
            session = self.case.generator.adapter.session(self.context())
        except Exception as exc:  # noqa: BLE001 - the generator under test failed to build
            raise GeneratorFailure(f"building the generator raised {one_line(exc)}") from exc
        emitted = np.full((samples, 1), -1, dtype=np.int64)
        n_matches = np.zeros(samples, dtype=np.int64)
        drafts = np.zeros(samples, dtype=np.int64)
        impossible = np.zeros(samples, dtype=np.int64)
        started = time.perf_counter()
        with torch.no_grad():
            for t in range(samples):
                try:
                    candidate_ids, candidate_logits = session.draft(prompt)
                except Exception as exc:  # noqa: BLE001
                    raise GeneratorFailure(f"get_candidates raised {one_line(exc)}") from exc
                check_candidates(prompt, candidate_ids, candidate_logits, vocab, max_length)
                gamma = candidate_ids.shape[1] - length
                if candidate_logits is None or gamma == 0:
                    raise NotApplicable(
                        "returns no candidate_logits: _assisted_decoding then samples the target at every position "
                        "(no q to check), so step mode does not apply"
                    )
                if gamma + 1 > emitted.shape[1]:
                    emitted = _widen(emitted, gamma + 1)
                drafts[t] = gamma
                # As _assisted_decoding: the verifier gets candidate_logits in the dtype returned.
                q_of_drafts = torch.softmax(candidate_logits[0], dim=-1).gather(-1, candidate_ids[0, length:, None])
                impossible[t] = int((q_of_drafts == 0).sum())
                valid_tokens, n = self.verify(candidate_ids, candidate_logits, gamma, self.target_logits(candidate_ids))
                tokens = valid_tokens[0].numpy()
                emitted[t, : len(tokens)] = tokens
                n_matches[t] = int(n)
                if progress is not None:
                    progress(1)
        return Observations(emitted, n_matches, drafts, impossible, time.perf_counter() - started)

    def position_strata(self, obs: Observations, position: int) -> list[Stratum]:
        """Strata for output position ``position`` (0-based): trials grouped by their exact target law."""
        return self._strata(obs.emitted[obs.emitted[:, position] >= 0], position, self.laws.target)

    def residual_strata(self, obs: Observations, position: int) -> list[Stratum]:
        """Trials whose draft ``position + 1`` was rejected (not missing: a draft that stopped early
        ends in a token sampled from ``p``), against ``normalize(max(p - q, 0))``.

        ``q`` is the processed drafter table, the law a correct drafter samples from.
        """
        rejected = obs.emitted[(obs.n_matches == position) & (obs.drafts > position)]
        return self._strata(rejected, position, self.laws.residual)

    def _strata(self, rows: np.ndarray, position: int, law_of) -> list[Stratum]:
        ids, laws = self._stratify(rows, position, law_of)
        vocab = self.case.scenario.vocab_size
        kept = ids >= 0
        counts = np.bincount(ids[kept] * vocab + rows[kept, position], minlength=len(laws) * vocab)
        return [Stratum(c, law) for c, law in zip(counts.reshape(len(laws), vocab), laws)]

    @staticmethod
    def _stratify(rows: np.ndarray, position: int, law_of) -> tuple[np.ndarray, list[np.ndarray]]:
        """Stratum of every row at ``position``: rows with the same exact law (given their prefix)
        share one; -1 where ``law_of`` has no law."""
        laws: list[np.ndarray] = []
        index: dict[bytes, int] = {}
        of_prefix: dict[tuple, int] = {}
        ids = np.empty(len(rows), dtype=np.int64)
        for r, row in enumerate(rows[:, :position].tolist()):
            prefix = tuple(row)
            if prefix not in of_prefix:
                law = law_of(prefix)
                if law is None:
                    of_prefix[prefix] = -1
                else:
                    of_prefix[prefix] = index.setdefault(law.tobytes(), len(laws))
                    if of_prefix[prefix] == len(laws):
                        laws.append(law)
            ids[r] = of_prefix[prefix]
        return ids, laws

    def log_evalues(self, obs: Observations) -> np.ndarray:
        """Running log e-values of the output laws, ``(gamma + 2, trials)``: one row per position
        (:func:`lossless_check.stats.mixture_log_evalues` over the trials that reached it, strata as
        in :meth:`position_strata`), then their product (all positions' evidence together).

        Every row is a test martingale over trials for a lossless round: given the earlier trials and
        the earlier positions of its own trial, a trial's token at position ``j`` follows
        ``p_j(. | prefix)`` whenever it reached ``j``.
        """
        rows = []
        for j in range(obs.gamma + 1):
            reached = np.flatnonzero(obs.emitted[:, j] >= 0)
            ids, laws = self._stratify(obs.emitted[reached], j, self.laws.target)
            running = mixture_log_evalues(ids, obs.emitted[reached, j], laws)
            per_trial = np.zeros(len(obs.n_matches))
            per_trial[reached] = np.diff(running, prepend=0.0)
            rows.append(np.cumsum(per_trial))
        rows.append(np.sum(rows, axis=0))
        return np.array(rows)


def position_tests(result: CaseResult, strata_by_position: list[list[Stratum]], alpha_case: float) -> int:
    """Test the output law at every position; fill ``result``; return the number of support violations.

    Each position gets ``alpha_case / positions`` and the case's p-value is their Bonferroni
    combination. Position 1 also gives the case's headline TV, its interval and the chi-square / G
    diagnostics, and (when it is a single stratum) the empirical and expected laws for reports.
    """
    alpha_position = alpha_case / len(strata_by_position)
    result.alpha_case = alpha_case
    pvalues, violations = [], 0
    for j, strata in enumerate(strata_by_position):
        test = law_test(strata, alpha_position, POWER)
        violations += test.support_violations
        pvalues.append(test.pvalue)
        result.positions.append({
            "position": j + 1,
            "samples": test.n,
            "strata": len(strata),
            "tv": test.statistic,
            "tv_threshold": test.threshold_tv,
            "tv_detectable": test.tv_detectable,
            "p_value": test.pvalue,
            "chi2_p_value": test.chi2_pvalue,
            "support_violations": test.support_violations,
        })
        if test.pvalue <= alpha_position:
            result.failed_checks.append(f"output_law@{j + 1}")
        if j == 0:
            result.tv, result.tv_detectable = test.statistic, test.tv_detectable
            result.tv_ci = tv_confidence_interval(strata)
            result.chi2, result.chi2_dof, result.chi2_p_value, result.g_p_value = (
                test.chi2, test.chi2_dof, test.chi2_pvalue, test.g_pvalue)
            if len(strata) == 1:
                result.empirical_law = (strata[0].counts / max(strata[0].n, 1)).tolist()
                result.expected_law = strata[0].expected.tolist()
    result.p_value = bonferroni_min(pvalues)
    if violations:
        result.failed_checks.insert(0, "support")
    return violations


def analyse(step: StepCase, obs: Observations, alpha_case: float) -> CaseResult:
    """Statistics of one case at its share ``alpha_case`` of the family error rate."""
    case = step.case
    gamma = obs.gamma
    result = CaseResult(case.generator.display_name, case.warper_spec, case.mode, case.scenario.name)
    result.samples = len(obs.n_matches)
    result.seconds = obs.seconds
    result.samples_per_second = result.samples / obs.seconds if obs.seconds > 0 else None
    violations = position_tests(result, [step.position_strata(obs, j) for j in range(gamma + 1)], alpha_case)
    if obs.impossible_drafts:
        result.failed_checks.append("impossible_draft")
    result.exact_failure = bool(violations or obs.impossible_drafts)

    diagnostics: list[str] = []
    alpha_position = alpha_case / (gamma + 1)
    for j in range(gamma):
        residual = law_test(step.residual_strata(obs, j), alpha_position, POWER)
        entry = result.positions[j]
        entry["residual_samples"], entry["residual_tv"] = residual.n, residual.statistic
        entry["residual_p_value"] = residual.pvalue
        if residual.n and residual.rejects(alpha_position):
            diagnostics.append(f"residual@{j + 1}")

    result.acceptance_rate = float(obs.n_matches.sum() / obs.drafts.sum())
    result.acceptance_law = (np.bincount(obs.n_matches, minlength=gamma + 1) / len(obs.n_matches)).tolist()
    # The theory is for drafts of one length; a drafter that stops early (at EOS) has no such law.
    law = step.laws.acceptance_law(gamma) if obs.drafts.min() == gamma else None
    if law is not None:
        result.expected_acceptance_rate = law.mean_acceptance_rate
        result.expected_acceptance_law = law.probabilities.tolist()
        counts = np.bincount(obs.n_matches, minlength=gamma + 1)
        acceptance = law_test([Stratum(counts, law.probabilities)], alpha_case, POWER)
        result.acceptance_p_value = acceptance.pvalue
        result.acceptance_statistic = acceptance.statistic
        if acceptance.rejects(alpha_case):
            diagnostics.append("acceptance_law")
    result.diagnostics = diagnostics
    return result


@dataclass
class RunResult:
    """All cases of a run, with the family-wise decision applied."""

    cases: list[CaseResult]
    alpha_family: float
    seed: int
    samples: int

    @property
    def exit_code(self) -> int:
        if any(c.verdict == "not_lossless" for c in self.cases):
            return 1
        if any(c.verdict == "error" for c in self.cases):
            return 3 if all(c.verdict == "error" for c in self.cases) else 1
        return 0


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


def skip_reason(case: Case) -> str | None:
    """Why a case cannot run on this install (``None`` if it can)."""
    if case.generator.generator_class is None:
        return f"{case.generator.adapter.name} is not in the installed transformers"
    if case.scenario.drafter.kind not in case.generator.adapter.drafter_kinds:
        return f"a {case.scenario.drafter.kind} drafter table cannot drive {case.generator.adapter.name}"
    return None


_STEP_CASES: dict[str, StepCase] = {}


def _step_case(case: Case) -> StepCase:
    """One StepCase per case and process: stubs and processors are built once, not per chunk."""
    if case.key not in _STEP_CASES:
        _STEP_CASES.clear()  # keep only the case being worked on
        _STEP_CASES[case.key] = StepCase(case)
    return _STEP_CASES[case.key]


#: Seconds one chunk may take before its case is an ``error`` (a hung generator). Normal rounds take
#: milliseconds: a chunk of 1000 takes seconds.
CHUNK_TIMEOUT = 600.0


@contextmanager
def deadline(seconds: float, what: str):
    """Raise :class:`GeneratorFailure` in this (main) thread after ``seconds``; a no-op elsewhere."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise GeneratorFailure(f"{what} ran past {seconds:g} s: the generator hangs (or --timeout is too small)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def collect_chunk(case: Case, seed: int, chunk: int, size: int,
                  timeout: float = CHUNK_TIMEOUT) -> Observations | GeneratorFailure | NotApplicable:
    """Trials of one chunk (a work unit, run in any process); a failure is returned, not raised."""
    try:
        with deadline(timeout, f"a chunk of {size} trials"):
            return _step_case(case).collect(size, case_seed(seed, case, chunk))
    except (GeneratorFailure, NotApplicable) as exc:
        return exc


def _finish(case: Case, parts: list, alpha_case: float, sequential: bool = False,
            final: bool = True) -> CaseResult | None:
    """The case's result from its chunks so far; ``None`` when a sequential case goes on."""
    failures = [p for p in parts if isinstance(p, (GeneratorFailure, NotApplicable))]
    result = CaseResult(case.generator.display_name, case.warper_spec, case.mode, case.scenario.name)
    if failures:
        result.verdict = "skipped" if isinstance(failures[0], NotApplicable) else "error"
        result.reason = str(failures[0])
        return result
    try:
        obs = Observations.concatenate(parts)
    except GeneratorFailure as exc:
        result.verdict, result.reason = "error", str(exc)
        return result
    if sequential:
        return sequential_analysis(_step_case(case), obs, alpha_case, final)
    return analyse(_step_case(case), obs, alpha_case)


def sequential_analysis(step: StepCase, obs: Observations, alpha_case: float, final: bool) -> CaseResult | None:
    """A sequential case at one look: its result if it stops here, else ``None``.

    ``alpha_case`` is split in halves. One half goes to an anytime-valid test: the mean of the
    test martingales of :meth:`StepCase.log_evalues` (one per position, and their product) is
    watched after every trial, and the case stops at the first trial where it reaches
    ``2 / alpha_case`` (Ville's inequality: under the null this happens with probability at most
    ``alpha_case / 2``, however long the run). The other half goes to the fixed-sample test of
    :func:`analyse` at the planned sample count, which gives the ``tv_detectable`` guarantee of a
    clean pass. An exact failure stops the case at the look that sees it.
    """
    log_e = step.log_evalues(obs)
    combined = logsumexp(log_e, axis=0) - math.log(len(log_e))
    crossed = np.flatnonzero(combined >= math.log(2.0 / alpha_case))
    rejected = crossed.size > 0
    if rejected:
        obs = obs.head(int(crossed[0]) + 1)
    result = analyse(step, obs, alpha_case / 2)
    if not (rejected or final or result.exact_failure):
        return None
    trials = len(obs.n_matches)
    result.log_e_value = float(combined[:trials].max())
    p_anytime = min(1.0, math.exp(-result.log_e_value))
    if final and not rejected:
        result.p_value = min(1.0, 2 * min(p_anytime, result.p_value))
    else:
        # Stopped before the planned sample count: the fixed-sample test's level does not hold here.
        result.p_value = min(1.0, 2 * p_anytime)
        result.failed_checks = [c for c in result.failed_checks if c in EXACT_CHECKS]
        if rejected:
            result.failed_checks.append("e_value")
    for entry, row in zip(result.positions, log_e):
        entry["log_e_value"] = float(row[trials - 1])
    result.alpha_case = alpha_case
    return result


def look_schedule(samples: int, sequential: bool) -> list[int]:
    """Cumulative sample counts at which a case is analysed.

    Fixed-N: one look at ``samples``. Sequential: looks at 125, 250, 500, 1000, 2000, ... trials and
    at ``samples`` (the anytime test is checked at every trial; the looks only decide how much work
    is done before checking). Looks fall on chunk boundaries, so a sequential run sees exactly the
    data of the fixed-N run with the same seed, cut short.
    """
    if not sequential:
        return [samples]
    looks, n = [], FIRST_CHUNKS[0]
    while n < samples:
        looks.append(n)
        n *= 2
    return looks + [samples]


def _compute(units, cases, seed, pool, progress, timeout) -> dict:
    done = {}
    if pool is None:
        for index, chunk, size in units:
            done[(index, chunk)] = collect_chunk(cases[index], seed, chunk, size, timeout)
            if progress is not None:
                progress(size)
        return done
    futures = {pool.submit(collect_chunk, cases[i], seed, c, n, timeout): (i, c, n) for i, c, n in units}
    for future in as_completed(futures):
        index, chunk, size = futures[future]
        done[(index, chunk)] = future.result()
        if progress is not None:
            progress(size)
    return done


def execute(cases: list[Case], samples: int, seed: int, alpha_case: float, workers: int = 1,
            progress: Callable[[int], None] | None = None, sequential: bool = False,
            timeout: float = CHUNK_TIMEOUT) -> list[CaseResult]:
    """Run every case's trials in chunks, on ``workers`` processes; results do not depend on ``workers``.

    ``sequential``: analyse at each look of :func:`look_schedule` and stop a case as
    :func:`sequential_analysis` says. A chunk running past ``timeout`` seconds makes its case an
    ``error``.
    """
    results: list[CaseResult | None] = [None] * len(cases)
    active = []
    for index, case in enumerate(cases):
        reason = skip_reason(case)
        if reason is not None:
            results[index] = CaseResult(case.generator.display_name, case.warper_spec, case.mode, case.scenario.name,
                                        verdict="skipped", reason=reason)
            continue
        _step_case(case)  # builds the processors here first: bad warpers stop the run before any work
        active.append(index)
    looks = look_schedule(samples, sequential)
    sizes = chunk_sizes(samples)
    parts: dict[int, list] = defaultdict(list)
    pool = worker_pool(workers) if workers > 1 and active else None
    try:
        done_chunks = 0
        for look, n_look in enumerate(looks, 1):
            final = look == len(looks)
            chunks = range(done_chunks, len(chunk_sizes(n_look)))
            done_chunks = len(chunk_sizes(n_look))
            computed = _compute([(i, c, sizes[c]) for i in active for c in chunks], cases, seed, pool, progress,
                                timeout)
            for index in list(active):
                parts[index] += [computed[(index, c)] for c in chunks]
                failed = any(isinstance(p, (GeneratorFailure, NotApplicable)) for p in parts[index])
                if not (final or sequential or failed):
                    continue
                result = _finish(cases[index], parts[index], alpha_case, sequential, final)
                if result is not None:
                    results[index] = result
                    active.remove(index)
    finally:
        if pool is not None:
            pool.shutdown()
    return results  # type: ignore[return-value]


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A run's pool of ``workers`` fresh (spawned) processes, one core each."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker)


def _init_worker() -> None:
    """Initializer of a worker process of a run's pool."""
    # Each worker owns one core: a torch thread pool per worker would oversubscribe.
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()


def run_case(case: Case, samples: int, seed: int, alpha_case: float,
             progress: Callable[[int], None] | None = None) -> CaseResult:
    """Run and analyse one case in this process (no family-wise decision)."""
    return execute([case], samples, seed, alpha_case, 1, progress)[0]


def run(cases: list[Case], samples: int, alpha: float, seed: int,
        progress: Callable[[int], None] | None = None, workers: int = 1, sequential: bool = False) -> RunResult:
    """Run every case and apply the family-wise decision at rate ``alpha``."""
    results = execute(cases, samples, seed, alpha / max(1, len(cases)), workers, progress, sequential)
    decide(results, alpha)
    return RunResult(results, alpha, seed, samples)
