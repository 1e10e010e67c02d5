"""The three modes, siblings on one engine, each turning a case into observations and a result.

- ``step`` (:mod:`.step`): one verification round per trial, statistical, batched where it can be;
- ``generate`` (:mod:`.generate`): the real ``generate()`` loop, statistical;
- ``provenance`` (:mod:`.provenance`): exact and white-box, no sampling error;
- ``all``: step with provenance beside it (a run adds generate mode for each case).

:func:`run_case` is the one task the engine runs per case, in any process.
"""

from __future__ import annotations

from ..results import Case, CaseResult

MODES = ("step", "provenance", "generate", "all")
#: Modes whose verdict is statistical (they spend a share of the family's alpha).
STATISTICAL_MODES = ("step", "generate", "all")


def skip_reason(case: Case) -> str | None:
    """Why a case of any mode is skipped before it runs (``None``: it runs)."""
    if case.mode in ("step", "all"):
        from .step import skip_reason as step_skip

        return step_skip(case)
    if case.mode == "generate":
        from .generate import skip_reason as generate_skip

        return generate_skip(case)
    return None


def run_case(case: Case, samples: int, seed: int, alpha_case: float, sequential: bool = True,
             timeout: float = 600.0, batch_size: int | None = None) -> CaseResult:
    """Run and analyse one case of any mode at ``alpha_case`` (the verdict is re-decided across a run).

    ``all`` cases run step mode here; the provenance check is attached after the family-wise
    decision (:func:`~.provenance.attach_provenance`).
    """
    if case.mode in ("step", "all"):
        from .step import BATCH_SIZE, run_step_case

        return run_step_case(case, samples, seed, alpha_case, sequential, timeout,
                             BATCH_SIZE if batch_size is None else batch_size)
    if case.mode == "generate":
        from .generate import run_generate_case

        return run_generate_case(case, samples, seed, alpha_case, sequential, timeout)
    if case.mode == "provenance":
        from .provenance import run_provenance_case

        return run_provenance_case(case, seed)
    raise ValueError(f"unknown mode {case.mode!r}")
