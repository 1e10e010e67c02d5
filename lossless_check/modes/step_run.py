"""A step case run as seeded chunks and looks: collected here or split across workers, kept in the
chunk store, analysed at each look, with a batched result never failing the case (see :meth:`StepRun.analyse`).
"""

from __future__ import annotations

import os

from lossless_check.evidence.analysis import stop_sequentially
from lossless_check.evidence.attribution import accepted_impossible, attribute, without
from lossless_check.evidence.results import Case, CaseResult
from lossless_check.modes.batching import BATCH_SIZE
from lossless_check.modes.observations import Observations
from lossless_check.modes.randomness import FRESH_CALLS, owns_randomness
from lossless_check.modes.replay import BatchMismatch, replays_per_chunk
from lossless_check.modes.step import StepCase, skip_reason
from lossless_check.running.chunks import guarded, kept, run_in_chunks, within_deadline


def run_step_case(case: Case, samples: int, seed: int, alpha_case: float, sequential: bool = True,
                  timeout: float = 600.0, batch_size: int = BATCH_SIZE, store=None) -> CaseResult:
    """Run and analyse one step-mode case (no family-wise decision).

    Fixed (``sequential=False``): the law tests at ``alpha_case`` after ``samples`` trials.
    Sequential: :func:`~lossless_check.evidence.analysis.stop_sequentially` after each look. ``store``: where
    finished chunks are kept (:func:`~lossless_check.running.chunks.kept`).
    """
    return StepRun(case, samples, seed, alpha_case, sequential, timeout, batch_size, store).run()


class StepRun:
    """A step case as seeded chunks and looks: run whole (:meth:`run`), or split, its chunks collected
    elsewhere (:meth:`collect_here` in :attr:`state`) for ``run(fetch)`` (:mod:`lossless_check.running.scheduler`).
    ``store`` (a :class:`~lossless_check.running.journal.ChunkStore`, or ``None``) keeps its finished chunks."""

    def __init__(self, case: Case, samples: int, seed: int, alpha_case: float, sequential: bool = True,
                 timeout: float = 600.0, batch_size: int = BATCH_SIZE, store=None):
        self.case, self.samples, self.seed, self.alpha_case = case, samples, seed, alpha_case
        self.sequential, self.timeout, self.batch_size = sequential, timeout, batch_size
        self.store = store
        self.replays = replays_per_chunk(samples)
        self._step: StepCase | None = None
        self._batch_1: str | None = None

    @property
    def step(self) -> StepCase:
        """The case's stubs, processors and generator, built on first use (inside :func:`guarded`)."""
        if self._step is None:
            self._step = StepCase(self.case, self.batch_size)
            if self._batch_1 is not None:
                self._step.run_at_batch_1(self._batch_1)
        return self._step

    @property
    def state(self) -> str | None:
        """What a process collecting this case's chunks must know: why it moved to batch 1, or ``None``."""
        return self._batch_1

    def restore(self, state: str | None) -> None:
        """Collect as a run in ``state`` (:attr:`state`) does."""
        self._batch_1 = state
        if self._step is not None and state is not None:
            self._step.run_at_batch_1(state)

    def facts(self):
        """What the generator was built with here (e.g. a fast tokenizer's vocabulary order, per process);
        for a generator that manages its own randomness, this process too (:func:`~.randomness.owns_randomness`):
        chunks collected elsewhere, or kept by an earlier run, are then not this case's."""
        facts = getattr(self.step.session(), "facts", None)
        if owns_randomness(self._batch_1) or self.step.own_randomness.seen is not None:
            return {"randomness_of_process": os.getpid(), **(facts or {})}
        return facts

    def collect_here(self, chunk: int, size: int, chunk_seed: int) -> Observations:
        """One chunk, collected in this process under the per-chunk deadline."""
        return within_deadline(self.timeout, lambda c, n, s: self.step.collect(
            n, s, self.replays[c], FRESH_CALLS if c == 0 else 0))(
            chunk, size, chunk_seed)

    def kept_outcomes(self, state) -> dict[int, tuple]:
        """The chunks :attr:`store` keeps for ``state``, as a split case's outcomes (``("ok",
        observations, facts)``, as :func:`~lossless_check.running.scheduler.collect_chunk` returns them)."""
        if self.store is None:
            return {}
        outcomes = {}
        for chunk in self.store.kept(self.case.key, state):
            found = self.store.load(self.case.key, state, chunk)
            if found is not None:
                outcomes[chunk] = ("ok", *found)
        return outcomes

    def keep(self, state, chunk: int, outcome: tuple) -> None:
        """Keep a chunk a worker collected for a split case (``outcome`` as :meth:`kept_outcomes`)."""
        if self.store is not None and outcome[0] == "ok":
            self.store.save(self.case.key, state, chunk, outcome[1], outcome[2])

    def analyse(self, parts: list[Observations], final: bool) -> CaseResult | None:
        """The look over ``parts`` (the chunks so far, in order): a result, or ``None`` to go on."""
        step, alpha_case = self.step, self.alpha_case
        obs = Observations.concatenate(parts)
        # Accepted drafts of target probability 0 are the verifier's doing: set aside (attribution).
        aside = accepted_impossible(obs.emitted, obs.n_matches, step.laws.target)
        obs = without(obs, aside >= 0)
        if not self.sequential:
            return attribute(self._batch_1_only(step.analyse(obs, alpha_case)), aside, obs.impossible_drafts)
        log_e, outside_support = step.evidence(obs)
        exact = bool(obs.impossible_drafts) or outside_support
        result = stop_sequentially(lambda trials, alpha: step.analyse(obs if trials is None else obs.head(trials), alpha),
                                   log_e, alpha_case, final, exact)
        return None if result is None else attribute(self._batch_1_only(result), aside, obs.impossible_drafts)

    def _batch_1_only(self, result: CaseResult) -> CaseResult:
        """A result whose verdict rests on batch-1 behaviour only.

        Batched rows are the harness's construct: they may pass a case (with the guarantee of
        :meth:`StepCase._batch_1_guarantee`), never fail it, except by an impossible draft that a batch-1
        replay of its row returned too (:func:`~.replay.confirm_impossible`). A batched result that would fail (an exact
        failure, or its p-value at or below the case's alpha) raises :class:`~.replay.BatchMismatch`,
        and the case runs again at batch 1 with its whole alpha, where a failure is the real loop's.
        A batched result that passes gives Holm's family the p-value 1, so that no step-down across
        cases can turn batched evidence into a failure either; its own p-value is ``batch.p_value``.
        """
        if result.batch["batch_size"] == 1:
            return result
        if "impossible_draft" in result.failed_checks:
            # Every impossible draft of a batched row was confirmed at batch 1 (replay.confirm_impossible):
            # the real loop's own exact failure. Nothing else the batched rows show may fail the case.
            result.batch["p_value"], result.p_value = result.p_value, 1.0
            result.batch["note"] += "; each impossible draft returned again by a batch-1 replay of its row"
            result.failed_checks = ["impossible_draft"]
            return result
        if result.exact_failure or result.p_value <= self.alpha_case:
            checks = ", ".join(result.failed_checks) or "output law"
            raise BatchMismatch(f"the batched rows failed ({checks}; p = {result.p_value:.3g}): only batch-1 "
                                f"calls, which the real loop makes, may fail a case")
        result.batch["p_value"] = result.p_value
        result.p_value = 1.0
        return result

    def run(self, fetch=None) -> CaseResult:
        """The result; ``fetch(chunk, size, chunk_seed)`` gets each chunk (default: collected here)."""
        case = self.case
        reason = skip_reason(case)
        if reason is not None:
            return case.result(verdict="skipped", reason=reason)
        fetch = fetch or kept(self.store, case, self.collect_here, lambda: self.state, self.facts)

        def run() -> CaseResult:
            try:
                return run_in_chunks(case, self.samples, self.seed, self.sequential, fetch, self.analyse)
            except BatchMismatch as exc:  # batched rows say nothing of the real loop: start again at batch 1
                self.restore(str(exc))
                return run_in_chunks(case, self.samples, self.seed, self.sequential, fetch, self.analyse)

        return guarded(case, run)
