"""The Python API: :func:`check` one generator, :func:`run` a matrix, and :func:`run_cases` under both.

    import lossless_check as lc

    result = lc.check("DFlashTokenCandidateGenerator", warpers="top_k=3")
    print(result.verdict, result.p_value, result.tv, result.tv_detectable)
    print(result.explain())

Generators are named as on the command line: a built-in class name, or ``module:attr`` for a user
class or factory. A run controls the family-wise false-failure rate ``alpha`` over all of its
statistical cases (Holm); a single :func:`check` is a family of one.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Callable, Iterable

from lossless_check.core.errors import UsageError
from lossless_check.core.options import DEFAULT_ALPHA, DEFAULT_SAMPLES
from lossless_check.evidence.results import DEFAULT_MAX_DETECTABLE_TV, Case, CaseResult, RunResult, decide
from lossless_check.faces.case_lists import (  # noqa: F401 (the cases of a run, public here too)
    DEFAULT_SCENARIO, cases_for, greedy_cases, real_world_cases, resolve_scenario, stateful_cases, with_torch_draws,
)
from lossless_check.modes import STATISTICAL_MODES, chunked_run, preload, run_case, skip_reason
from lossless_check.modes.informativeness import attach_plan, evidence_plan
from lossless_check.running.chunks import CHUNK_TIMEOUT
from lossless_check.running.engine import make_engine


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped a run: ``partial`` holds its finished cases, decided among themselves,
    and the others as ``unfinished``."""

    def __init__(self, partial: RunResult):
        super().__init__(f"interrupted after {sum(c.verdict != 'unfinished' for c in partial.cases)} of "
                         f"{len(partial.cases)} cases")
        self.partial = partial


def run_cases(cases: list[Case], samples: int, alpha: float, seed: int, workers: int = 1,
              progress: Callable[[int], None] | None = None, sequential: bool = True,
              timeout: float = CHUNK_TIMEOUT, batch_size: int | None = None,
              samples_by_mode: dict[str, int] | None = None, journal=None, backend: str = "local",
              address: str | None = None, verifier: bool = False, verifier_gates: bool = False,
              chunks=None, max_detectable_tv: float = DEFAULT_MAX_DETECTABLE_TV) -> RunResult:
    """Run cases of any mode on one engine; the family-wise decision covers every statistical case.

    ``verifier``: add the exact check of the installed ``_speculative_sampling`` as the last row
    (:func:`~lossless_check.outputs.verifier_report.verifier_row`; no share of ``alpha``, outside Holm; last, so
    that ``results[i]`` stays the result of ``cases[i]``). It is a subject of the run (it can make the
    run fail) only with ``verifier_gates``; otherwise it is reported beside the cases (``subject=False``).

    Cases that carry a sampler (:func:`cases_for`'s ``sampler``): the last row is its own check
    (:func:`check_sampler`, in place of the installed verifier's row; a subject, its statistical part in
    the run's Holm family).

    ``samples_by_mode`` overrides ``samples`` for the cases of a mode (the gate runs the slower
    generate mode at fewer trials; each case states its own ``tv_detectable``). A case that rejects nothing
    but could not have seen a departure of TV ``max_detectable_tv`` is ``inconclusive``, not ``lossless``
    (:func:`~lossless_check.evidence.results.decide`).

    ``progress(trials)`` is called as each case completes, with the trials it ran. Results do not depend on ``workers``,
    nor on a worker lost mid-run (its tasks run again: :mod:`lossless_check.running.worker_loss`; stderr says so,
    and so does :attr:`RunResult.workers_lost`).
    ``journal`` (a :class:`~lossless_check.running.journal.Journal`): its finished cases are not run again, and
    each case is recorded there as it finishes; within the others, the chunks its store keeps are not
    collected again, and each chunk is kept there as it finishes (``chunks``: another
    :class:`~lossless_check.running.journal.ChunkStore`, for a run without a journal). A ``KeyboardInterrupt``
    (SIGINT; the CLI turns SIGTERM into one) stops the workers and raises :class:`RunInterrupted`. ``backend="ray"`` runs the case
    tasks on Ray (``address``: an existing cluster; default a local instance of ``workers`` CPUs).
    """
    if chunks is None and journal is None and backend == "ray":
        # A task Ray retries (its node lost) reads back the chunks it kept before: a run without a
        # journal keeps them for its own length, here (a node sharing this file system sees them).
        import tempfile

        from lossless_check.running.journal import ChunkStore

        with tempfile.TemporaryDirectory(prefix="lossless-chunks-") as kept:
            return run_cases(cases, samples, alpha, seed, workers, progress, sequential, timeout, batch_size,
                             samples_by_mode, journal, backend, address, verifier, verifier_gates,
                             chunks=ChunkStore(kept), max_detectable_tv=max_detectable_tv)
    _check_processors(cases)
    sampler = sampler_of(cases)
    statistical = [c.mode in STATISTICAL_MODES for c in cases]
    informative = evidence_plan(cases)
    tasks = [replace(c, mode="step") if c.mode == "all" else c for c in cases]
    results: list = [None if journal is None else journal.done.get(i) for i in range(len(cases))]
    todo = [i for i, r in enumerate(results) if r is None]
    chunks = chunks if chunks is not None or journal is None else journal.chunks
    planned = [(samples_by_mode or {}).get(t.mode, samples) for t in tasks]

    def finished(k: int, result: CaseResult) -> None:
        results[todo[k]] = result
        if journal is not None:
            journal.record(todo[k], result)

    workers_lost: list[dict] = []

    def lost(loss) -> CaseResult:
        """A task a lost worker cost: said on stderr and kept for the report; a case not run again is an error."""
        case = cases[todo[loss.index]]
        workers_lost.append({**loss.to_dict(), "index": todo[loss.index], "case": case.key})
        where = case.key + ("" if loss.chunk is None else f", chunk {loss.chunk}")
        again = "runs again" if loss.redone else "is not run again: the case is an error"
        print(f"lossless-check: a worker was lost: {where} {again} ({loss.reason})", file=sys.stderr)
        return case.result(verdict="error", reason=f"{loss.reason} running this case; not run again")

    try:
        with make_engine(workers, backend, address) as engine:
            engine.start_early(len(todo), preload)
            # Alpha is split over the cases that can produce evidence: not a case known to be skipped or to
            # error before its trials (modes.skip_reason: its probes take seconds, while the workers start),
            # nor one vacuous by the exact laws (it still runs, for its exact checks; decide() gives it no share).
            alpha_case = alpha / max(1, sum(s and i != [] and skip_reason(c, timeout) is None
                                            for c, s, i in zip(cases, statistical, informative))
                                     + (sampler is not None))
            planned = _rounds_capped(cases, planned, alpha, sequential, max_detectable_tv, timeout)
            engine.map(run_case, [(tasks[i], planned[i], seed, alpha_case, sequential, timeout, batch_size, chunks)
                                  for i in todo], progress,
                       cost=[_work_estimate(tasks[i], planned[i]) for i in todo], finished=finished,
                       split=chunked_run, lost=lost)
    except KeyboardInterrupt:
        partial = [r or c.result(verdict="unfinished", reason="the run was interrupted before this case finished")
                   for c, r in zip(cases, results)]
        for case, result, positions in zip(tasks, partial, informative):
            if result.verdict != "unfinished":
                attach_plan(result, case, positions)
        decide([r for r, s in zip(partial, statistical) if s], alpha, max_detectable_tv)
        raise RunInterrupted(RunResult(partial, alpha, seed, samples, interrupted=True,
                                       workers_lost=workers_lost)) from None
    for case, result, positions in zip(tasks, results, informative):
        attach_plan(result, case, positions)
    own = [] if sampler is None else [_sampler_row(sampler, samples, alpha_case, seed, cases, results)]
    decide([r for r, s in zip(results, statistical) if s] + own, alpha, max_detectable_tv)
    for case, task, result in zip(cases, tasks, results):
        if case.mode == "all":
            from lossless_check.modes.provenance import attach_provenance

            attach_provenance(result, task, seed)
    if own:
        results += own
    elif verifier:
        from lossless_check.outputs.verifier_report import verifier_row

        results.append(verifier_row(cases[0].scenario.name if cases else DEFAULT_SCENARIO, subject=verifier_gates))
    return RunResult(results, alpha, seed, samples, workers_lost=workers_lost)


def _sampler_row(sampler, samples: int, alpha_case: float, seed: int, cases: list[Case],
                 results: list[CaseResult]) -> CaseResult:
    """The row of a run's sampler; the cases it ran in say so, and blame it for what the verifier did."""
    from lossless_check.outputs.sampler_report import blame_sampler, sampler_row
    from lossless_check.running.workers import one_thread
    from lossless_check.subjects.sampler_check import check_sampler as check

    for case, result in zip(cases, results):
        if case.sampler is not None:
            blame_sampler(result, case.sampler.spec)
    with one_thread():
        report = check(sampler, samples=samples, alpha=alpha_case, seed=seed)
    return sampler_row(report, cases[0].scenario.name if cases else DEFAULT_SCENARIO)


#: The TV, as a share of the run's bar, that a step case of a generator returning no q is sized to detect.
ROUNDS_SIZED_FOR = 0.8


def _rounds_capped(cases: list[Case], planned: list[int], alpha: float, sequential: bool, bar: float,
                   timeout: float) -> list[int]:
    """``planned``, with the step cases of generators that return no q cut to the trials that detect
    :data:`ROUNDS_SIZED_FOR` times the run's bar: each of their trials is a whole ``generate()`` round (6-13 ms,
    about 100 step trials' cost), and the bar is what a pass claims (its row states its own ``tv_detectable``)."""
    from lossless_check.modes import runs_rounds
    from lossless_check.modes.sample_size import samples_to_detect

    rounds = [runs_rounds(c, timeout) for c in cases]
    if not any(rounds):
        return planned
    cap = samples_to_detect(cases, ROUNDS_SIZED_FOR * bar, alpha, sequential=sequential)
    return [min(n, cap) if r else n for n, r in zip(planned, rounds)]


#: Rough trials per second of one core, by mode, at a small vocabulary (measured on 5.24); a case
#: above :data:`~lossless_check.evidence.analysis.COARSEN_ABOVE_VOCAB` runs about 30 times slower (the
#: drafter's real top-p and sampling over 32,000 logits). Used only to order the work queue and to
#: choose the cases split across workers (:func:`~lossless_check.running.scheduler.should_split`).
_TRIALS_PER_SECOND = {"step": 2000.0, "provenance": 2000.0, "generate": 100.0}
#: Seconds of one options case (a dozen generate() calls with every output option; measured on 5.24: 2-8 s).
_OPTIONS_SECONDS = 8.0
#: Seconds of one greedy case (measured on 5.24: 4-6 s on markov8, MTP 19 s).
_GREEDY_SECONDS = 6.0


def _work_estimate(case: Case, samples: int) -> float:
    from lossless_check.evidence.analysis import COARSEN_ABOVE_VOCAB

    if case.mode == "greedy":
        return _GREEDY_SECONDS  # a fixed set of comparisons, whatever ``samples``
    if case.mode == "options":
        return _OPTIONS_SECONDS

    large = getattr(case.scenario, "vocab_size", 0) > COARSEN_ABOVE_VOCAB
    return samples / _TRIALS_PER_SECOND.get(case.mode, 100.0) * (30.0 if large else 1.0)


def _check_processors(cases: list[Case]) -> None:
    """Build each distinct warper stack's processors once here, so that values ``generate()``
    refuses stop the run with a usage error before any work."""
    import torch

    from lossless_check.laws.scenarios import Scenario
    from lossless_check.laws.stubs import fixed_logits_lm
    from lossless_check.laws.warpers import capture_processors, format_warpers

    seen = set()
    for case in cases:
        key = (case.scenario.name, format_warpers(case.warpers))
        if key in seen or not isinstance(case.scenario, Scenario):
            continue
        seen.add(key)
        scenario = case.scenario
        target = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
        capture_processors(target, torch.tensor([scenario.prompt]), case.warpers, 4)


def run(generators: Iterable[str] | str | None = None, warpers=None, matrix: str | None = None, mode: str = "step",
        scenario: str | None = None, samples: int = DEFAULT_SAMPLES, alpha: float = DEFAULT_ALPHA, seed: int = 0,
        workers: int = 1, sequential: bool = True, max_new_tokens: int = 4,
        progress: Callable[[int], None] | None = None, verifier: bool = True,
        verifier_gates: bool | None = None, sampler=None,
        max_detectable_tv: float = DEFAULT_MAX_DETECTABLE_TV, torch_draws: bool = False) -> RunResult:
    """Check every generator under every warper stack; verdicts control the family-wise rate ``alpha``.

    ``generators``: names or ``module:attr`` specs (default: every built-in); ``warpers``: a spec
    string (``"top_k=3,temperature=0.7"``), a dict of ``GenerationConfig`` keywords, or a list of
    either; ``matrix``: ``smoke``, ``default`` or ``full`` (default when no ``warpers``: ``default``);
    ``scenario``: a scenario name (default: ``markov8``, plus the matrix's real-world slices, see
    :func:`cases_for`). ``sequential`` (default): a case stops at the first trial its anytime e-value rejects; a clean
    case runs to ``samples``. Returns a :class:`~lossless_check.evidence.results.RunResult` (``.cases``,
    ``.exit_code``, ``.counts()``). ``verifier`` (default): the run's last row is the exact check of
    the installed ``_speculative_sampling`` (``lossless-check verifier``); ``False`` leaves it out.
    The exit code and counts are the subjects': the named ``generators``, and the verifier only in a
    run over every built-in (``generators=None``) or with ``verifier_gates=True``; otherwise its row
    is reported beside them (``subject`` false). ``workers`` > 1 starts worker processes that import
    the calling script again (multiprocessing's spawn): call this under ``if __name__ == "__main__":``
    (a call outside it is refused with a :class:`~lossless_check.core.errors.UsageError` saying so).
    A case that rejects nothing but could not have seen a departure of TV ``max_detectable_tv`` (power 0.99)
    is ``inconclusive``; a subject with no checked case, or an inconclusive one, gives ``exit_code`` 5.
    ``sampler`` (``module:function``): runs in place of the installed ``_speculative_sampling`` in every
    step and generate case, and the last row is its own check (:func:`check_sampler`).
    ``torch_draws``: every draw by torch's own kernel, none by the harness's inverse CDF (:func:`with_torch_draws`).
    """
    cases = cases_for(generators, warpers, matrix, mode, scenario, max_new_tokens, sampler,
                      torch_draws)
    gates = generators is None if verifier_gates is None else verifier_gates
    return run_cases(cases, samples, alpha, seed, workers, progress, sequential, verifier=verifier,
                     verifier_gates=gates, max_detectable_tv=max_detectable_tv)


def sampler_of(cases: list[Case]):
    """The sampler the cases carry (:func:`cases_for`), if any."""
    return next((c.sampler for c in cases if c.sampler is not None), None)


def check(generator: str, warpers=None, mode: str = "step", scenario: str = DEFAULT_SCENARIO,
          samples: int = DEFAULT_SAMPLES, alpha: float = DEFAULT_ALPHA, seed: int = 0, sequential: bool = True,
          max_new_tokens: int = 4, max_detectable_tv: float = DEFAULT_MAX_DETECTABLE_TV,
          torch_draws: bool = False) -> CaseResult:
    """Check one generator under one warper stack (plain sampling when ``warpers`` is ``None``).

    Returns a :class:`~lossless_check.evidence.results.CaseResult`: ``verdict`` (``lossless``,
    ``not_lossless``, ``inconclusive`` (nothing rejected, but a departure of TV ``max_detectable_tv`` could not
    have been seen: not a pass), ``vacuous`` (the stack leaves nothing for ``q`` to change: only the exact checks
    ran), ``error`` or ``skipped``), ``p_value``, ``tv``, ``tv_detectable`` (the smallest
    TV at position 1 detected with probability 0.99) and ``explain()``. The chance that a lossless
    generator is reported ``not_lossless`` is at most ``alpha``. Only ``lossless`` is a pass.
    ``torch_draws``: every draw by torch's own kernel (:func:`with_torch_draws`); ``substituted_draws`` counts
    the draws made otherwise.
    """
    if mode == "all":
        raise UsageError("check() takes one mode: step, generate, provenance or greedy")
    cases = cases_for([generator], warpers if warpers is not None else "none", None, mode, scenario, max_new_tokens,
                      torch_draws=torch_draws)
    return run_cases(cases[:1], samples, alpha, seed, sequential=sequential,
                     max_detectable_tv=max_detectable_tv).cases[0]


def check_sampler(sampler, protocol: str | None = None, samples: int = DEFAULT_SAMPLES, alpha: float = DEFAULT_ALPHA,
                  seed: int = 0):
    """Check a rejection sampler of your own: ``module:function`` or the function itself.

    Two protocols (read from the signature; ``protocol`` states it): ``"transformers"``, the installed
    ``_speculative_sampling``'s ``(candidate_input_ids, candidate_logits, candidate_length, new_logits, ...)
    -> (valid_tokens, n_matches)``, and ``"probs"``, ``(draft_probs (k, V), draft_token_ids (k,),
    target_probs (k + 1, V)) -> emitted ids``. Exact where every draw it makes goes through the torch
    primitives the check controls (each enumerated; the emitted law computed exactly on designed laws),
    statistical always (``samples`` trials on each of several draft/target pairs, family-wise
    false-failure rate ``alpha``). Returns a :class:`~lossless_check.subjects.sampler_check.SamplerReport`
    (``verdict``, ``reason``, ``exact``, ``statistical``, ``to_dict()``).
    """
    from lossless_check.running.workers import one_thread
    from lossless_check.subjects.sampler_check import check_sampler as check

    with one_thread():
        return check(sampler, protocol, samples, alpha, seed)
