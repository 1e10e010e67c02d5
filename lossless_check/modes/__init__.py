"""The three modes, siblings on one engine, each turning a case into observations and a result.

- ``step`` (:mod:`.step`): one verification round per trial, statistical, batched where it can be;
- ``generate`` (:mod:`.generate`): the real ``generate()`` loop, statistical;
- ``provenance`` (:mod:`.provenance`): exact and white-box, no sampling error;
- ``greedy`` (:mod:`.greedy`): exact, ``do_sample=False`` through the real loop against plain greedy decoding;
- ``options`` (:mod:`.loop_options`): exact, what ``generate()`` returns and streams beside the tokens, and the
  heuristic draft schedule;
- ``all``: step with provenance beside it (a run adds generate mode for each case).

:func:`run_case` is the one task the engine runs per case, in any process; :func:`chunked_run` the
same case as chunks, for the engine to split over its workers. Beside them: informativeness (which cases
can show anything), the interception of sampling primitives, and a user's own model pair (:mod:`.models`).

May import running, evidence, subjects, laws, stats and core.
"""

from __future__ import annotations

from lossless_check.evidence.results import Case, CaseResult

MODES = ("step", "provenance", "generate", "greedy", "options", "all")
#: Modes whose verdict is statistical (they spend a share of the family's alpha).
STATISTICAL_MODES = ("step", "generate", "all")


def skip_reason(case: Case, timeout: float = 600.0) -> str | None:
    """Why a case of any mode will give no verdict of its own (``None``: it can): skipped, or, in step
    mode, skipped or errored at its first ``get_candidates`` call (:func:`probe`).

    A run splits its alpha over the other cases. A wrong ``None`` only costs power: the case's share
    was reserved and Holm's family is the cases that did produce a p-value.
    """
    if case.mode in ("step", "all"):
        from lossless_check.modes.step import skip_reason as step_skip

        return step_skip(case) or probe(case, timeout)
    if case.mode == "generate":
        from lossless_check.modes.generate import skip_reason as generate_skip

        return generate_skip(case)
    if case.mode == "greedy":
        from lossless_check.modes.greedy import skip_reason as greedy_skip

        return greedy_skip(case)
    if case.mode == "options":
        from lossless_check.modes.loop_options import skip_reason as options_skip

        return options_skip(case)
    return None


#: :func:`probe` per generator and scenario (the scenario kept with its id, which is unique only while it lives):
#: the scenario, why the case stops, and whether the generator returns no q.
_PROBED: dict[tuple, tuple[object, str | None, bool]] = {}


def probe(case: Case, timeout: float = 600.0) -> str | None:
    """Why a step case stops at its first ``get_candidates`` call, or ``None``: one call on the case's
    generator and scenario under plain sampling, built as the case builds it.

    What it finds does not depend on the warpers (a stub that cannot hold the vocabulary, a generator
    that fails to build; one that returns no ``q`` runs, as rounds of the real loop), so it is made once per generator and
    scenario. A generator the probe sees fail in any other way is left to the case, which reports it.
    """
    from dataclasses import replace

    from lossless_check.core.errors import GeneratorFailure, NotApplicable
    from lossless_check.modes.step import StepCase
    from lossless_check.running.chunks import deadline

    key = (case.generator.spec, id(case.scenario))
    if _PROBED.get(key, (None,))[0] is not case.scenario:
        rounds = False
        try:
            with deadline(timeout, "probing the generator with one get_candidates call"):
                # A generator returning no q is no reason to stop: its trials are rounds of the real loop.
                rounds = StepCase(replace(case, warpers={}, mode="step"), batch_size=1).returns_no_q
            reason = None
        except (NotApplicable, GeneratorFailure) as exc:
            reason = str(exc)
        _PROBED[key] = case.scenario, reason, rounds
    return _PROBED[key][1]


def runs_rounds(case: Case, timeout: float = 600.0) -> bool:
    """Whether a step case's trials are whole rounds of the real loop (its generator returns no q: :func:`probe`)."""
    if case.mode not in ("step", "all") or skip_reason(case, timeout) is not None:
        return False
    return _PROBED[(case.generator.spec, id(case.scenario))][2]


def preload() -> None:
    """Import what :func:`run_case` needs in every mode (a worker starting up imports it here, in
    parallel with the run's set-up, rather than in its first case)."""
    import lossless_check.modes.generate  # noqa: F401
    import lossless_check.modes.greedy  # noqa: F401
    import lossless_check.modes.step_run  # noqa: F401


def run_case(case: Case, samples: int, seed: int, alpha_case: float, sequential: bool = True,
             timeout: float = 600.0, batch_size: int | None = None, store=None) -> CaseResult:
    """Run and analyse one case of any mode at ``alpha_case`` (the verdict is re-decided across a run).

    ``all`` cases run step mode here; the provenance check is attached after the family-wise
    decision (:func:`~.provenance.attach_provenance`). ``store`` (a
    :class:`~lossless_check.running.journal.ChunkStore`): the statistical modes keep each finished chunk
    there, and read back the chunks an interrupted run kept instead of collecting them again.
    """
    if case.mode in ("step", "all"):
        from lossless_check.modes.step import BATCH_SIZE
        from lossless_check.modes.step_run import run_step_case

        return run_step_case(case, samples, seed, alpha_case, sequential, timeout,
                             BATCH_SIZE if batch_size is None else batch_size, store)
    if case.mode == "generate":
        from lossless_check.modes.generate import run_generate_case
        from lossless_check.subjects.sampler import sampler_in_place

        with sampler_in_place(case.sampler):  # the global _assisted_decoding calls
            return run_generate_case(case, samples, seed, alpha_case, sequential, timeout, store)
    if case.mode == "provenance":
        from lossless_check.modes.provenance import run_provenance_case

        return run_provenance_case(case, seed)
    if case.mode == "greedy":
        from lossless_check.modes.greedy import run_greedy_case

        return run_greedy_case(case, seed, timeout)
    if case.mode == "options":
        from lossless_check.modes.loop_options import run_options_case

        return run_options_case(case, seed, timeout)
    raise ValueError(f"unknown mode {case.mode!r}")


def chunked_run(case: Case, samples: int, seed: int, alpha_case: float, sequential: bool = True,
                timeout: float = 600.0, batch_size: int | None = None, store=None):
    """The case of :func:`run_case` (same arguments) as chunks and looks, for the engine to split over
    its workers; ``None`` for a case that runs only as one task.

    Step mode splits (:class:`~.step.StepRun`). Generate mode does not yet: a ``generate()`` call
    may leave state behind that the next calls' random stream sees (measured: Universal's first call
    builds its translator), so its chunks are not yet shown to be functions of their seeds alone.
    Provenance runs one call.
    """
    if case.mode not in ("step", "all"):
        return None
    from lossless_check.modes.step import BATCH_SIZE
    from lossless_check.modes.step import skip_reason as step_skip
    from lossless_check.modes.step_run import StepRun

    if step_skip(case) is not None:
        return None
    batch_size = BATCH_SIZE if batch_size is None else batch_size
    return StepRun(case, samples, seed, alpha_case, sequential, timeout, batch_size, store)
