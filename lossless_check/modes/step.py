"""Step mode: one verification round per trial, through the real generator and the real verifier.

Per trial, as ``_assisted_decoding`` does on its first round: ``get_candidates()`` of a fresh real
generator; the target's logits for every candidate position, processed by the real
``LogitsProcessorList`` with the candidate prefix as history; the installed
``_speculative_sampling`` on that one row. The emitted tokens and ``n_matches`` are recorded.

**Batched trials.** Where the generator family can draft several rows in one real
``get_candidates`` call (``adapter.batchable``, or a user's factory), the trials of a chunk are the
rows of calls on :data:`BATCH_SIZE` identical prompt rows (fewer at a large vocabulary:
:func:`~.batching.rows_per_call`), and each row then goes alone through the
verifier. The real loop only ever calls a generator with one row, so rows drawn at random from those
calls are replayed at batch 1 with the same draws (:mod:`.replay`): at the first row that differs
the case starts again at batch 1 and says why, and a batched case's ``tv_detectable`` is the one that
holds for batch-1 calls. Batched rows never fail a case (:meth:`StepRun._batch_1_only`), and calls
that seed, restore or privately generate randomness move it to batch 1 (:mod:`.randomness`).
Families that cannot batch run every trial at batch 1.
A generator that returns no q (:attr:`StepCase.returns_no_q`) has trials that are first rounds of the
real loop (:mod:`.loop_round`), tested with the same per-position laws.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from lossless_check.core.compat import ABSENT, generator_processors, speculative_sampling
from lossless_check.core.errors import GeneratorFailure, NotApplicable, Timeout
from lossless_check.evidence.analysis import position_tests, sequential_evidence, strata
from lossless_check.evidence.results import POWER, Case, CaseResult, one_line
from lossless_check.laws.expected import UNSAMPLEABLE, ExactLaws, plain_sampling_fails, unsampleable
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.laws.warpers import capture_processors
from lossless_check.modes.batching import (
    BATCH_SIZE,
    STAGE_POWER,
    decide_batching,
    draft_lengths,
    family_flag,
    rows_per_call,
)
from lossless_check.modes.interception import VerifierDraws
from lossless_check.modes.loop_models import GREEDY_FAMILIES
from lossless_check.modes.loop_round import ROUND_NOTE, LoopRounds, no_q
from lossless_check.modes.observations import Observations, widen
from lossless_check.modes.randomness import (
    FRESH_LEVEL,
    OWN_RANDOMNESS,
    OwnRandomness,
    fresh_draws_evalue,
    own_randomness_reason,
    repeated_noise,
    seed_streams,
    watched_randomness,
)
from lossless_check.modes.replay import (
    BatchMismatch,
    SamplerLog,
    confirm_impossible,
    impossible_drafts,
    replay_detectable_tv,
    replay_rows,
    replays_per_chunk,
)
from lossless_check.modes.step_diagnostics import diagnose
from lossless_check.modes.target_side import TargetLogits
from lossless_check.stats import Stratum
from lossless_check.subjects.adapters import DraftContext
from lossless_check.subjects.candidates import check_candidates

#: ``max_new_tokens`` of the generation config in step mode: far enough that no candidate is cut.
STEP_MAX_NEW_TOKENS = 64


class StepCase:
    """Builds the stubs, the processors and the real generator of one case; runs its trials."""

    def __init__(self, case: Case, batch_size: int = BATCH_SIZE):
        self.case = case
        scenario = case.scenario
        self.prompt_ids = torch.tensor([scenario.prompt], dtype=torch.long)
        self.target = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
        self.processors, self.generation_config = capture_processors(
            self.target, self.prompt_ids, case.warpers, STEP_MAX_NEW_TOKENS
        )
        self.laws = ExactLaws(scenario, self.processors)
        self.verify = speculative_sampling() if case.sampler is None else case.sampler.verify
        self.positions = scenario.gamma + 1
        self.requested_batch_size = batch_size
        eos = self.generation_config.eos_token_id
        self.eos = frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)
        self.stops_at_eos = family_flag(case.generator.adapter, "drafts_stop_at_eos")
        self._session = None
        self._batching: tuple[int, str] | None = None
        #: What batch-1 calls were seen do with randomness they manage themselves (:mod:`.randomness`).
        self.own_randomness = OwnRandomness()
        self.target_side = TargetLogits(scenario.target, self.target, self.processors, self.prompt_ids)
        self._returns_no_q: bool | None = None
        self._loop_rounds: LoopRounds | None = None

    # -- the generator -------------------------------------------------------------------------

    def context(self) -> DraftContext:
        return DraftContext(
            scenario=self.case.scenario,
            generator_class=self.case.generator.generator_class,
            generation_config=self.generation_config,
            processors=generator_processors(self.processors),
            target=self.target,
            prompt_ids=self.prompt_ids,
        )

    def session(self):
        """The adapter's session (stubs and everything reusable), built once."""
        if self._session is None:
            try:
                self._session = self.case.generator.adapter.session(self.context())
            except NotApplicable:
                raise
            except Exception as exc:  # noqa: BLE001 - the generator under test failed to build
                raise GeneratorFailure(f"building the generator raised {one_line(exc)}") from exc
        return self._session

    def checked_draft(self, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One real ``get_candidates`` call on ``rows`` prompt rows, checked (``candidate_logits`` may be ``None``)."""
        prompt = self.prompt_ids.expand(rows, -1)
        try:
            candidate_ids, candidate_logits = self.session().draft(prompt)
        except (GeneratorFailure, NotApplicable):
            raise
        except Exception as exc:  # noqa: BLE001 - the generator under test raised
            raise GeneratorFailure(f"get_candidates raised {one_line(exc)}") from exc
        check_candidates(prompt, candidate_ids, candidate_logits, self.case.scenario.vocab_size,
                         self.generation_config.max_length)
        return candidate_ids, candidate_logits

    def draft(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One real ``get_candidates`` call on ``rows`` prompt rows, checked, with a q to verify."""
        candidate_ids, candidate_logits = self.checked_draft(rows)
        if no_q(candidate_ids, candidate_logits, self.prompt_ids.shape[1]):  # its first call had one
            raise NotApplicable("returns candidate_logits on one call on the prompt and none (or no draft) on "
                                "another: step mode verifies one kind or the other (generate mode takes both)")
        return candidate_ids, candidate_logits

    @property
    def returns_no_q(self) -> bool:
        """Whether the generator returns no ``candidate_logits`` (or drafts nothing) on the prompt: the case's
        trials are then rounds of the real loop. One batch-1 call tells, before any trial's seed is set."""
        if self._returns_no_q is None:
            candidate_ids, candidate_logits = self.checked_draft(1)
            self._returns_no_q = no_q(candidate_ids, candidate_logits, self.prompt_ids.shape[1])
        return self._returns_no_q

    @property
    def loop_rounds(self) -> LoopRounds:
        """The real loop, routed to build the case's generator (:mod:`.loop_round`), built once."""
        if self._loop_rounds is None:
            self._loop_rounds = LoopRounds(self.context(), self.case, STEP_MAX_NEW_TOKENS, self.own_randomness)
        return self._loop_rounds

    @property
    def starts_batched(self) -> bool:
        """Whether the case's first trials are rows of batched calls (even if it moved to batch 1 since)."""
        return not self.returns_no_q and decide_batching(self.case.generator, self.requested_batch_size)[0] > 1

    @property
    def power(self) -> float:
        """The power each stage of the case states its ``tv_detectable`` at: :data:`~.batching.STAGE_POWER`
        for a case that starts batched (its batched stage, then possibly a batch-1 stage, each may
        miss), else :data:`~lossless_check.evidence.results.POWER`."""
        return STAGE_POWER if self.starts_batched else POWER

    @property
    def batching(self) -> tuple[int, str]:
        """``(rows per call, why)``; 1 when the case runs at batch 1 only."""
        if self._batching is None and self.returns_no_q:
            self._batching = (1, ROUND_NOTE)
        if self._batching is None:
            rows, why = decide_batching(self.case.generator, self.requested_batch_size)
            self._batching = (rows if rows == 1 else rows_per_call(rows, self.case.scenario.vocab_size), why)
        return self._batching

    def run_at_batch_1(self, why: str) -> None:
        """From now on every trial is a batch-1 call, because ``why``."""
        self._batching = (1, f"batch 1: {why}")

    # -- the target ----------------------------------------------------------------------------

    def target_logits(self, candidate_ids: torch.Tensor) -> torch.Tensor:
        """The verifier's ``new_logits`` for a candidate (:meth:`.target_side.TargetLogits.of`)."""
        return self.target_side.of(candidate_ids)

    # -- trials --------------------------------------------------------------------------------

    def collect(self, samples: int, seed: int, replays: int | None = None, fresh: int = 0) -> Observations:
        """``samples`` trials: rows of batched calls, ``replays`` of them (chosen at random; by
        default the share of a case of ``samples`` trials) replayed at batch 1, or batch-1 calls when
        the case does not batch. A batched case first makes ``fresh`` unforced batch-1 calls whose
        draws must pass :func:`~.randomness.fresh_draws_evalue`. Raises :class:`~.replay.BatchMismatch`
        when a replay differs, or when the draws may not be what the replays assume (:mod:`.randomness`).

        The trials are a function of ``seed`` alone (a split case collects chunks anywhere), unless the
        generator manages its own randomness (:mod:`.randomness`): the session, whose building may draw
        random numbers, is built before the seed is set."""
        self.session()
        if self.returns_no_q:
            return self.loop_rounds.collect(samples, seed, self.positions)
        seed_streams(seed)
        batch_size = self.batching[0]
        replayed = np.zeros(samples, dtype=bool)
        if batch_size > 1:
            self.check_fresh_draws(fresh)
            count = sum(replays_per_chunk(samples)) if replays is None else replays
            replayed[np.random.default_rng(seed).choice(samples, size=min(count, samples), replace=False)] = True
        emitted = np.full((samples, self.positions), -1, dtype=np.int64)
        n_matches, drafts, impossible = (np.zeros(samples, dtype=np.int64) for _ in range(3))
        substituted = np.zeros((samples, 2))  # per trial: the verifier's draw, the batched drafts' share
        length = self.prompt_ids.shape[1]
        started = time.perf_counter()
        t = 0
        with torch.no_grad():
            while t < samples:
                rows = min(batch_size, samples - t)
                candidate_ids, candidate_logits, lengths, zero_q = self.draft_rows(rows, replayed[t : t + rows])
                gamma = candidate_ids.shape[1] - length
                if gamma + 1 > emitted.shape[1]:
                    emitted = widen(emitted, gamma + 1)
                impossible[t : t + rows], drafts[t : t + rows] = zero_q.sum(axis=1), lengths
                substituted[t : t + rows, 1] = self._drafts_substituted / rows if rows > 1 else 0
                with VerifierDraws(self.case.scenario.vocab_size, self.case.torch_draws) as draws:
                    for r in range(rows):
                        g = lengths[r]
                        candidates = candidate_ids[r : r + 1, : length + g]
                        valid_tokens, n = self.verified(candidates, candidate_logits[r : r + 1, :g], g)
                        substituted[t, 0] = draws.tally.take()
                        tokens = valid_tokens[0].numpy()
                        emitted[t, : len(tokens)] = tokens
                        n_matches[t] = int(n)
                        t += 1
        return Observations(emitted, n_matches, drafts, impossible, replayed, time.perf_counter() - started,
                            *substituted.T)

    def verified(self, candidates: torch.Tensor, candidate_logits: torch.Tensor, gamma: int):
        """The installed verifier on one row. If it raises where the processed target is
        :func:`~..expected.unsampleable` at a position (every earlier draft has ``p > 0``, so plain
        sampling reaches that prefix and fails there too), the case is
        :class:`~..errors.PlainSamplingFails`, not an internal error."""
        new_logits = self.target_logits(candidates)
        try:
            return self.verify(candidates, candidate_logits, gamma, new_logits)
        except RuntimeError:
            broken = unsampleable(new_logits[0]).nonzero()
            if not len(broken):
                raise
            first, start = int(broken[0]), self.prompt_ids.shape[1]
            drafted = candidates[0, start : start + first]
            p_drafted = new_logits[0, :first].softmax(-1).gather(-1, drafted[:, None])
            if bool((p_drafted == 0).any()):  # plain sampling never reaches this prefix
                raise
            end = start + first
            raise plain_sampling_fails(candidates[0, :end].tolist(), UNSAMPLEABLE) from None

    def draft_rows(self, rows: int, replay: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, list[int], np.ndarray]:
        """One call on ``rows`` rows (``candidate_ids``, ``candidate_logits``, each row's draft
        length, its :func:`impossible_drafts`), its rows where ``replay`` is set replayed at batch 1 first."""
        length = self.prompt_ids.shape[1]
        if rows == 1:
            with self.own_randomness.watching() as drafted:
                candidate_ids, candidate_logits = self.draft(1)
                drafted(candidate_ids)
            lengths = [candidate_ids.shape[1] - length]
            return candidate_ids, candidate_logits, lengths, impossible_drafts(candidate_ids, candidate_logits,
                                                                               lengths, length)
        vocab = self.case.scenario.vocab_size
        with watched_randomness():
            try:
                with SamplerLog(vocab, keep=np.flatnonzero(replay).tolist(),
                                exact_draws=not self.case.torch_draws) as log:
                    candidate_ids, candidate_logits = self.draft(rows)
            except Timeout:
                raise
            except GeneratorFailure as exc:  # the batched call is the harness's construct, not the loop's
                raise BatchMismatch(f"a call on {rows} rows failed ({exc})") from exc
            self._drafts_substituted = log.tally.substituted
            lengths = draft_lengths(candidate_ids[:, length:], self.eos, self.stops_at_eos)
            replay_rows(self.draft, candidate_ids, candidate_logits, log, lengths, np.flatnonzero(replay).tolist(),
                        length, vocab)
            zero_q = impossible_drafts(candidate_ids, candidate_logits, lengths, length)
            confirm_impossible(self.draft, candidate_ids, log, lengths, np.flatnonzero(zero_q.sum(1)).tolist(), length,
                               vocab)
        return candidate_ids, candidate_logits, lengths, zero_q

    def check_fresh_draws(self, calls: int) -> None:
        """``calls`` unforced batch-1 calls; raise :class:`~.replay.BatchMismatch` if their draws are not
        fresh draws from the laws they were given (:func:`~.randomness.fresh_draws_evalue`)."""
        if calls <= 0:
            return
        draws, noise = [], []
        with watched_randomness():
            for _ in range(calls):
                with SamplerLog(self.case.scenario.vocab_size) as log:
                    try:
                        self.draft(1)
                    except GeneratorFailure as exc:
                        raise BatchMismatch(f"an unforced batch-1 call raised ({exc})") from exc
                draws += log.calls
                noise += [n for n in log.noise if n is not None]
        if repeated_noise(noise):
            raise BatchMismatch(f"{calls} unforced batch-1 calls drew the same vocabulary-wide noise twice: it is not "
                                f"the fresh noise the forced replays stand for")
        log_e = fresh_draws_evalue(draws)
        if log_e >= math.log(1.0 / FRESH_LEVEL):
            raise BatchMismatch(f"the draws of {calls} unforced batch-1 calls are not fresh draws from the laws "
                                f"they were given (e-value {math.exp(min(log_e, 700.0)):.3g} >= 1/{FRESH_LEVEL:g})")

    # -- analysis ------------------------------------------------------------------------------

    def position_strata(self, obs: Observations, position: int) -> list[Stratum]:
        """Strata for output position ``position`` (0-based): trials grouped by their exact target law."""
        if position >= obs.emitted.shape[1]:
            return []
        return strata(obs.emitted[obs.emitted[:, position] >= 0], position, self.laws.target,
                      self.case.scenario.vocab_size)

    def log_evalues(self, obs: Observations) -> np.ndarray:
        """The running log e-values of the output laws (:func:`~lossless_check.evidence.analysis.log_evalues`)."""
        return self.evidence(obs)[0]

    def evidence(self, obs: Observations) -> tuple[np.ndarray, bool]:
        """The log e-values and whether a token fell outside its law's support
        (:func:`~lossless_check.evidence.analysis.sequential_evidence`)."""
        return sequential_evidence(obs.emitted, self.positions_of(obs), self.laws.target,
                                   self.case.scenario.vocab_size)

    def positions_of(self, obs: Observations) -> int:
        """Output positions tested: the scenario's ``gamma + 1`` (more only if a generator drafts more)."""
        return max(self.positions, obs.emitted.shape[1])

    def analyse(self, obs: Observations, alpha: float) -> CaseResult:
        """Statistics of one case at ``alpha`` (its share of the family rate, less what a sequential
        run gives the anytime test)."""
        case = self.case
        result = case.result(samples=len(obs.n_matches), seconds=obs.seconds, substituted_draws=obs.substituted_draws)
        result.samples_per_second = result.samples / obs.seconds if obs.seconds > 0 else None
        positions = self.positions_of(obs)
        size, note = self.batching
        if self.own_randomness.seen is not None and OWN_RANDOMNESS not in note:
            note = f"{note}; {own_randomness_reason(self.own_randomness.seen)}"
        batched = result.samples if size > 1 else 0
        result.batch = {"batch_size": size, "note": note, "batch1_trials": result.samples - batched,
                        "batched_trials": batched}
        result.generator_facts = getattr(self.session(), "facts", None) or None
        violations = position_tests(result, [self.position_strata(obs, j) for j in range(positions)], alpha,
                                    self.power)
        if batched:
            self._batch_1_guarantee(result, int(obs.replayed.sum()), self.power)
        result.alpha_case = alpha
        if obs.impossible_drafts:
            result.failed_checks.append("impossible_draft")
        result.exact_failure = bool(violations or obs.impossible_drafts)
        # The diagnostics of a verified q (acceptance law, residuals); a round without one has none.
        diagnose(result, obs, self.laws, self.positions, alpha / positions, verified=not self.returns_no_q)
        return result

    @staticmethod
    def _batch_1_guarantee(result: CaseResult, replays: int, power: float) -> None:
        """State ``tv_detectable`` for batch-1 calls: at position 1, the batched rows' own plus what the
        clean replays leave unproven (:func:`~.replay.replay_detectable_tv`), both at ``power``.

        Nothing is stated for a later position (``tv_detectable`` ``None``; the batched rows' own figure is
        kept as ``tv_detectable_batched``): the coupling bounds the unconditional law of a round, and a
        batch-1 bug confined to rounds that reach position ``j`` (probability ``pi_j``) can move position
        ``j``'s conditional law by up to 1 while a replay sees it with probability ``pi_j`` only."""
        extra = replay_detectable_tv(replays, power)
        result.batch.update(replays=replays, replay_tv=extra, tv_detectable_batched=result.tv_detectable)
        result.tv_detectable = min(1.0, result.tv_detectable + extra)
        for entry in result.positions:
            entry["tv_detectable_batched"] = entry["tv_detectable"]
            entry["tv_detectable"] = result.tv_detectable if entry["position"] == 1 else None


def skip_reason(case: Case) -> str | None:
    """Why a case cannot run on this install (``None`` if it can)."""
    if case.generator.generator_class is None:
        return f"{case.generator.adapter.name} {ABSENT}"
    if case.generator.adapter.name in GREEDY_FAMILIES:
        return (f"generate() builds {case.generator.adapter.name} for greedy decoding only (do_sample=False), and it "
                f"returns no q: a sampling round of it is not one the real loop makes (generate mode checks it "
                f"against plain greedy decoding)")
    if getattr(case.scenario, "target_kind", None) is not None:  # one round from the prompt: nothing is rolled back
        return f"the {case.scenario.name} target's state is rolled back in generate and greedy modes only"
    if case.scenario.drafter.kind not in case.generator.adapter.drafter_kinds:
        return f"a {case.scenario.drafter.kind} drafter table cannot drive {case.generator.adapter.name}"
    if getattr(case.scenario, "drafter_padding", 0) and not case.generator.adapter.padded_drafter:
        return (f"{case.generator.adapter.name} drafts through the target's own head or hidden states: a drafter "
                f"head padded past the target's vocabulary does not apply to it")
    return None
