"""A run across modes: step (statistical), provenance (exact, white-box), generate (the real loop).

``all`` runs step and provenance for each generator x warper stack and puts the provenance
sub-verdict beside the statistical one; a contradiction between them is reported loudly.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from .errors import GeneratorFailure, NotApplicable
from .runner import CHUNK_TIMEOUT, Case, CaseResult, RunResult, decide, execute, skip_reason

MODES = ("step", "provenance", "generate", "all")
#: Drafts inspected per provenance case: the check is exact, a few rounds cover every position.
PROVENANCE_TRIALS = 3


def provenance_case(case: Case, seed: int) -> CaseResult:
    """A provenance-mode case: verdict from the exact check (no sampling error, no alpha spent)."""
    from .provenance import provenance_check

    result = CaseResult(case.generator.display_name, case.warper_spec, "provenance", case.scenario.name)
    reason = skip_reason(case)
    if reason is not None:
        result.verdict, result.reason = "skipped", reason
        return result
    try:
        prov = provenance_check(case, PROVENANCE_TRIALS, seed)
    except NotApplicable as exc:
        result.verdict, result.reason = "skipped", str(exc)
        return result
    except GeneratorFailure as exc:
        result.verdict, result.reason = "error", str(exc)
        return result
    result.provenance = prov.to_dict()
    result.samples, result.seconds = prov.trials, prov.seconds
    result.verdict = {"consistent": "lossless", "inconsistent": "not_lossless"}.get(prov.verdict, "error")
    result.exact_failure = prov.verdict == "inconsistent"
    if result.exact_failure:
        result.failed_checks.append("provenance")
    result.reason = prov.reason
    return result


def _attach_provenance(step: CaseResult, case: Case, seed: int) -> None:
    from .provenance import IMPLIED, provenance_check

    if step.verdict not in ("lossless", "not_lossless"):
        return
    try:
        prov = provenance_check(case, PROVENANCE_TRIALS, seed)
    except (GeneratorFailure, NotApplicable) as exc:
        step.provenance = {"verdict": "error" if isinstance(exc, GeneratorFailure) else "skipped", "reason": str(exc)}
        return
    step.provenance = prov.to_dict()
    implied = IMPLIED.get(prov.verdict)
    if implied is not None and implied != step.verdict:
        if step.verdict == "lossless":
            note = (f"DISAGREEMENT: provenance says {prov.verdict} ({prov.reason}) but the statistics did not detect "
                    f"it (detectable TV {step.tv_detectable:.3g}): the effect is below the run's power, or provenance "
                    "misread the draws")
        else:
            note = (f"DISAGREEMENT: provenance says {prov.verdict} but the statistical verdict is {step.verdict}: "
                    "a harness bug, an interception gap, or a statistical false alarm")
        step.reason = f"{note}; {step.reason}"


def run_modes(cases: list[Case], samples: int, alpha: float, seed: int, workers: int = 1,
              progress: Callable[[int], None] | None = None, max_new_tokens: int = 4,
              sequential: bool = False, timeout: float | None = None) -> RunResult:
    """Run cases of any mode; the family-wise decision covers every statistical case of the run."""
    statistical = [c for c in cases if c.mode in ("step", "generate", "all")]
    alpha_case = alpha / max(1, len(statistical))
    results: dict[int, CaseResult] = {}
    step_indices = [i for i, c in enumerate(cases) if c.mode in ("step", "all")]
    step_results = execute([replace(cases[i], mode="step") for i in step_indices], samples, seed, alpha_case,
                           workers, progress, sequential, timeout or CHUNK_TIMEOUT)
    results.update(zip(step_indices, step_results))
    generate_indices = [i for i, c in enumerate(cases) if c.mode == "generate"]
    if generate_indices:
        from .generate_mode import run_generate_cases

        results.update(zip(generate_indices, run_generate_cases([cases[i] for i in generate_indices], samples, seed,
                                                                alpha_case, max_new_tokens, workers, progress)))
    decide([results[i] for i in sorted(results)], alpha)
    for i, case in enumerate(cases):
        if case.mode == "provenance":
            results[i] = provenance_case(case, seed)
            if progress is not None:
                progress(samples)
        elif case.mode == "all":
            _attach_provenance(results[i], case, seed)
    return RunResult([results[i] for i in range(len(cases))], alpha, seed, samples)
