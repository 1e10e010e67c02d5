"""Batch-1 replay: proof, on the install being checked, that a batched row is what a batch-1 call returns.

``_assisted_decoding`` only ever calls a generator with one row, so a case whose trials are rows of
batched ``get_candidates`` calls must show that each row behaves as a batch-1 call would. Nothing is
taken on trust (no family flag, no test run elsewhere): rows drawn at random from the case's own
batched calls are replayed, each in a ``get_candidates`` call of its own on one row, with every
vocabulary-wide ``torch.multinomial`` forced to the token the batched call drew for that row
(:class:`SamplerLog`). The replay must then, exactly (up to float32 round-off between kernels,
provenance's :data:`~lossless_check.modes.interception.TOLERANCE` in total variation):

- draw each token from the law the batched call drew that row's token from,
- draw no more tokens than the row has,
- return the row's ``candidate_ids`` (cut at its first EOS for families whose drafts stop there),
- return the row's ``softmax(candidate_logits)`` at every draft position (the verifier sees only the
  softmax, so a constant added to the logits is the same q).

Vocabulary-wide random noise (``torch.rand``, ``rand_like``, ``Tensor.uniform_``, ``exponential_``
over the vocabulary: Gumbel-max sampling, an exponential race) is forced the same way: the replay's
``i``-th noise tensor, of shape ``(1, ...)``, is overwritten with row ``r`` of the batched call's
``i``-th, of shape ``(rows, ...)`` (each element an independent draw, so a row's slice is distributed
as the fresh noise of a batch-1 call, as a forced token is a draw from the row's law).

A batched call's own one-token-a-row draws from float32/float64 weights are made by inverse CDF in
float64 (:func:`~lossless_check.modes.interception.inverse_cdf_multinomial`; none with ``--torch-draws``):
the law ``torch.multinomial`` samples, at about a tenth of its CPU cost at V = 49,152, and all a forced
replay needs of the row's draws is that each is a draw from its row's law. Replays and every batch-1
drafting call draw with torch's own (the installed verifier's draw, at a large vocabulary, is by inverse
CDF too: :class:`~lossless_check.modes.interception.VerifierDraws`).

A difference anywhere raises :class:`BatchMismatch`, and the case runs at batch 1. So does a row
that cannot be replayed: a sampler drawing several tokens per row, noise whose shape is not the
batched call's with one row, or drafts drawn otherwise (e.g. noise not over the vocabulary), which
the replay cannot force and so drafts afresh: its drafts differ from the row's at once, or, if every
replay happens to coincide, drafts that are deterministic given the draws seen.

**What a clean replay proves** (:func:`replay_detectable_tv`). Couple a batch-1 call with a batched
row through the same draws wherever their laws agree: the two emit the same tokens unless the
batch-1 call differs from the row on that row's path, an event of some probability ``f`` which each
replay (a uniformly chosen row, replayed in an independent batch-1 call) observes. Hence the
output laws of batch-1 calls and of batched rows differ by at most ``f`` in total variation. If
``f >= ln(1 / (1 - power)) / m``, ``m`` replays all pass with probability at most
``(1 - f)^m <= 1 - power``; otherwise a batch-1 bug of TV ``d`` leaves batched rows at TV
``>= d - f``, which the law tests detect once ``d - f >= tv_detectable`` of the batched rows. So a
case detects a batch-1 bug of TV ``tv_detectable(batched) + ln(1 / (1 - power)) / m`` with
probability ``>= power``, whatever the bug: that sum, at ``power`` =
:data:`~.batching.STAGE_POWER` (the batched stage's share of the miss probability,
:mod:`.batching`), is the ``tv_detectable`` a batched case reports, at position 1 only. The
coupling bounds the law of a whole round: a bug confined to rounds that reach position ``j``
(probability ``pi_j``) may move position ``j``'s conditional law by up to 1 while a replay sees it
with probability ``pi_j``, so nothing is stated past position 1 (:meth:`~.step.StepCase._batch_1_guarantee`).
A replay has no false failure (a mismatch never fails a case; it only moves it to batch 1).
It assumes a batch-1 call's draws (and noise) are fresh draws from torch's global stream, which the
forced draws stand for: :mod:`.randomness` checks what it can of that.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from lossless_check.core.errors import GeneratorFailure
from lossless_check.evidence.results import POWER
from lossless_check.modes.interception import (
    TOLERANCE,
    DrawTally,
    Interception,
    call_argument,
    inverse_cdf_multinomial,
)
from lossless_check.running.chunks import chunk_sizes

#: A batched case replays this share of its trials at batch 1 (at least :data:`MIN_REPLAYS`): 200 of
#: 5,000, which adds ln(200) / 200 = 0.0265 to the case's ``tv_detectable`` (at the stage power 0.995). A replay costs about as
#: much as a batch-1 trial (2-5 ms): this share keeps the main job within its 6 minutes on 2 cores.
REPLAY_SHARE = 0.04
MIN_REPLAYS = 100


#: Why a sampler whose vocabulary-wide noise cannot be forced row by row runs at batch 1: an expected
#: fallback, not a finding.
UNFORCEABLE = ("its drafts draw vocabulary-wide random noise (e.g. Gumbel-max or an exponential race) in a shape "
               "that a batch-1 replay cannot force row by row, so every trial is a batch-1 call, as in the real "
               "loop (expected for such samplers)")


class BatchMismatch(Exception):
    """A batched row is not what a batch-1 call returns (or cannot be shown to be): run at batch 1."""


class SamplerLog(Interception):
    """The vocabulary-wide ``torch.multinomial`` calls made while active: ``calls[i]`` is
    ``(probability rows, tokens drawn)`` of the ``i``-th.

    With ``force``, call ``i`` of a one-row, one-token draw returns ``force[i]`` instead of what it
    drew (the original sampler still runs first, so the random stream advances as it would). With
    ``keep``, :attr:`noise` holds the ``keep`` rows (dimension 0) of each vocabulary-wide noise tensor
    (without, each one-row tensor whole);
    with ``force_noise``, the ``i``-th noise tensor, of shape ``(1, *force_noise[i].shape)``, is
    overwritten with ``force_noise[i]`` (in place, after the original drew, as for tokens), and
    :attr:`unforced_noise` says whether some noise could not be forced.
    """

    def __init__(self, vocab_size: int, force: list[int] | None = None, keep: list[int] | None = None,
                 force_noise: list[torch.Tensor | None] | None = None, exact_draws: bool = False):
        super().__init__(vocab_size)
        #: A batched call's one-token-a-row draws by :func:`~lossless_check.modes.interception.inverse_cdf_multinomial`,
        #: counted in :attr:`tally`.
        self.exact_draws = exact_draws
        self.tally = DrawTally()
        self.force = force
        self.force_noise = force_noise
        #: Per noise tensor: its ``keep`` rows (or itself, one row, without ``keep``), else ``None``.
        self.noise: list[torch.Tensor | None] = []
        self.unforced_noise = False
        #: Rows whose probabilities are kept (default all): the replays compare only the rows they
        #: replay, and normalising all 512 rows of a 49,152-token call in float64 cost 21 ms a draw.
        self.keep = keep
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._subset: list[bool] = []  # per call: whether only the ``keep`` rows were kept

    def law(self, call: int, row: int) -> torch.Tensor:
        """The (normalised) probabilities draw ``call`` sampled row ``row`` from (a kept row)."""
        probs = self.calls[call][0]
        return probs[self.keep.index(row) if self._subset[call] else row]

    def noise_row(self, call: int, row: int) -> torch.Tensor | None:
        """Row ``row`` (a kept row) of noise tensor ``call``, or ``None`` where it was not kept."""
        kept = self.noise[call]
        return None if kept is None else kept[self.keep.index(row)]

    def __enter__(self) -> "SamplerLog":
        draws = (lambda original: inverse_cdf_multinomial(original, self.tally)) if self.exact_draws else None
        for owner, name, record, sampler in ((torch, "multinomial", self._sampled, draws),
                                             (torch.Tensor, "multinomial", self._sampled, draws),
                                             (torch, "rand", self._noise, None), (torch, "rand_like", self._noise, None),
                                             (torch.Tensor, "uniform_", self._noise, None),
                                             (torch.Tensor, "exponential_", self._noise, None)):
            self._patch(owner, name, record, sampler)
        return self

    def _noise(self, out, args, kwargs) -> None:
        super()._noise(out, args, kwargs)
        if not out.dim() or out.shape[-1] != self.vocab_size:
            return
        i = len(self.noise)
        keep = self.keep if self.keep is not None else [0] if out.dim() > 1 and out.shape[0] == 1 else None
        rows = keep is not None and out.dim() > 1 and max(keep, default=-1) < out.shape[0]
        self.noise.append(out.detach()[keep].clone() if rows else None)
        if self.force_noise is None:
            return
        forced = self.force_noise[i] if i < len(self.force_noise) else None
        if forced is None or out.shape != (1, *forced.shape) or out.dtype != forced.dtype:
            self.unforced_noise = True
            return
        # In place: an in-place sampler's caller holds ``out``; rand() and rand_like() return it.
        with torch.no_grad():
            out.copy_(forced[None])

    def _sampled(self, out, args, kwargs) -> torch.Tensor | None:
        probs = call_argument(args, kwargs, 0, "input")
        if probs.dim() == 0 or probs.shape[-1] != self.vocab_size:
            return None
        flat = probs.reshape(-1, self.vocab_size)
        tokens = out.reshape(flat.shape[0], -1).clone()
        subset = self.keep is not None and flat.shape[0] > 1 and max(self.keep, default=0) < flat.shape[0]
        if subset:
            flat = flat[self.keep]
        self._subset.append(subset)
        i = len(self.calls)
        self.calls.append((self._rows(flat), tokens))
        if self.force is None or i >= len(self.force) or out.numel() != 1:
            return None  # nothing to force: the comparison reports the extra or multi-token draw
        return torch.full_like(out, self.force[i])


def replays_per_chunk(samples: int) -> list[int]:
    """Rows replayed in each chunk of a batched case of ``samples`` trials: :data:`REPLAY_SHARE` of
    them (at least :data:`MIN_REPLAYS`), spread over the chunks in proportion to their sizes."""
    total = total_replays(samples)
    cumulative = np.cumsum(chunk_sizes(samples))
    upto = [round(total * c / samples) for c in cumulative]
    return [b - a for a, b in zip([0] + upto[:-1], upto)]


def total_replays(samples: int) -> int:
    return min(samples, max(MIN_REPLAYS, round(samples * REPLAY_SHARE)))


def replay_detectable_tv(replays: int, power: float = POWER) -> float:
    """What ``replays`` clean replays add to a batched case's ``tv_detectable`` (module docstring)."""
    return 1.0 if replays <= 0 else min(1.0, math.log(1.0 / (1.0 - power)) / replays)


def _one_token_per_row(log: SamplerLog, batch: int, why: str) -> None:
    """Raise :class:`BatchMismatch` unless every sampler call of a ``batch``-row call drew one token a row."""
    for _, tokens in log.calls:
        if tokens.shape != (batch, 1):
            raise BatchMismatch(f"a sampler call drew {tuple(tokens.shape)} tokens in a {batch}-row call: {why}")


def _replayed(draft, log: SamplerLog, r: int, vocab: int, which: str, force_noise: bool = False):
    """``(ids, logits, replay log)`` of a batch-1 call through ``draft(1)`` with row ``r``'s draws forced
    (and its noise, with ``force_noise``); a generator failure there is a :class:`BatchMismatch`."""
    force = [int(tokens[r, 0]) for _, tokens in log.calls]
    noise = [log.noise_row(i, r) for i in range(len(log.noise))] if force_noise else None
    with SamplerLog(vocab, force, force_noise=noise) as replay:
        try:
            ids1, logits1 = draft(1)
        except GeneratorFailure as exc:
            raise BatchMismatch(f"the batch-1 replay of a row{which} raised ({exc})") from exc
    return ids1, logits1, replay


def replay_rows(draft, ids: torch.Tensor, logits: torch.Tensor, log: SamplerLog, lengths: list[int],
                rows: list[int], prompt_length: int, vocab: int) -> None:
    """Replay ``rows`` of a batched call (``ids``, ``logits``, the ``log`` of its sampler) at batch 1
    through ``draft(1)``; raise :class:`BatchMismatch` at the first row that differs."""
    batch = ids.shape[0]
    _one_token_per_row(log, batch, "rows cannot be replayed one by one")
    for r in rows:
        ids1, logits1, replay = _replayed(draft, log, r, vocab, "", force_noise=True)
        difference = _difference(r, lengths[r], ids, logits, log, ids1, logits1, replay, prompt_length)
        if difference == UNFORCEABLE:  # expected of such samplers: said as the fact it is, not as a failure
            raise BatchMismatch(UNFORCEABLE)
        if difference is not None:
            raise BatchMismatch(f"row {r} of a {batch}-row call differs from its batch-1 replay: {difference}")


def confirm_impossible(draft, ids: torch.Tensor, log: SamplerLog, lengths: list[int], rows: list[int],
                       prompt_length: int, vocab: int) -> None:
    """Confirm at batch 1 the impossible drafts of ``rows`` of a batched call, or raise :class:`BatchMismatch`.

    Each row is replayed in a batch-1 call through ``draft(1)``, its draws forced to the row's. The
    impossible draft is the real loop's own behaviour when the replay draws only tokens its own laws
    give positive probability (so a batch-1 call drawing fresh from those laws makes the same draws
    with positive probability), returns the row's drafts, and returns a q that, softmaxed as the
    verifier does, gives one of them probability 0 exactly. Otherwise the row is a batched construct:
    the case runs at batch 1, and the row never fails it."""
    batch = ids.shape[0]
    _one_token_per_row(log, batch, "an impossible draft cannot be replayed at batch 1")
    for r in rows:
        ids1, logits1, replay = _replayed(draft, log, r, vocab, " with an impossible draft")
        force = [int(tokens[r, 0]) for _, tokens in log.calls]
        n, end = lengths[r], prompt_length + lengths[r]
        possible = len(replay.calls) <= len(force) and all(
            tokens1.numel() == 1 and float(probs1[0, force[i]]) > 0 for i, (probs1, tokens1) in enumerate(replay.calls))
        if possible and ids1.shape == (1, end) and torch.equal(ids1[0], ids[r, :end]):
            q1 = torch.softmax(logits1[:, :n], dim=-1)[0].gather(-1, ids1[0, prompt_length:, None])[:, 0]
            if bool((q1 == 0).any()):
                continue
        raise BatchMismatch(f"row {r} of a {batch}-row call has an impossible draft that its batch-1 replay does "
                            f"not return")


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.to(torch.float64) - b.to(torch.float64)).abs().sum())


def _difference(r, n, ids, logits, log, ids1, logits1, replay, length) -> str | None:
    """How the replay of row ``r`` (``n`` drafts) differs from the row, or ``None``."""
    if len(replay.calls) > len(log.calls):
        return f"the batch-1 call drew {len(replay.calls)} tokens, the row {len(log.calls)}"
    for i, (probs1, tokens1) in enumerate(replay.calls):
        if tokens1.numel() != 1:
            return f"the batch-1 call's draw {i + 1} drew {tokens1.numel()} tokens"
        tv = _tv(probs1[0], log.law(i, r))
        if tv > TOLERANCE:
            return f"draw {i + 1} comes from another law at batch 1 (TV {tv:.3g})"
    row = ids[r, : length + n]
    if ids1.shape != (1, length + n) or not torch.equal(ids1[0], row):
        if replay.unforced_noise:
            return UNFORCEABLE
        return f"drafts {ids1[0, length:].tolist()} at batch 1, {row[length:].tolist()} in the batch"
    # As the verifier: the softmax of candidate_logits in the dtype returned.
    q1, q = torch.softmax(logits1[0, :n], dim=-1), torch.softmax(logits[r, :n], dim=-1)
    for j in range(n):
        tv = _tv(q1[j], q[j])
        if tv > TOLERANCE:
            return f"softmax(q) at draft position {j + 1} differs (TV {tv:.3g})"
    return None


def impossible_drafts(candidate_ids: torch.Tensor, candidate_logits: torch.Tensor, lengths: list[int],
                      prompt_length: int) -> np.ndarray:
    """``(rows, gamma)``: which drafts their returned q gives probability 0 (within each row's length).

    Only rows with a draft that :func:`surely_possible` cannot clear go through the softmax (a
    softmax of 512 x 4 x 49,152 logits per call cost 0.4 s of a 6 s lm49k chunk)."""
    gamma = candidate_ids.shape[1] - prompt_length
    drafted = candidate_ids[:, prompt_length:, None]
    zero = np.zeros((candidate_ids.shape[0], gamma), dtype=bool)
    check = (~surely_possible(candidate_logits, drafted)).any(-1).nonzero()[:, 0]
    if len(check):
        # As _assisted_decoding: the verifier gets candidate_logits in the dtype returned.
        q_of_drafts = torch.softmax(candidate_logits[check], dim=-1).gather(-1, drafted[check])[..., 0]
        zero[check.numpy()] = (q_of_drafts == 0).numpy()
    return zero & (np.arange(gamma) < np.asarray(lengths)[:, None])


def surely_possible(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Where ``softmax(logits)`` surely gives ``tokens`` (``(..., 1)``) a probability above 0 in the
    logits' dtype: their logit within ``ln(1 / (V * tiny)) - 1`` nats of the row's maximum, so that
    ``exp(x - max) / sum >= exp(x - max) / V`` is above the dtype's smallest normal number with a
    nat to spare for any kernel's rounding. ``False`` wherever that is not sure (NaN, infinities)."""
    vocab = logits.shape[-1]
    limit = -math.log(torch.finfo(logits.dtype).tiny) - math.log(vocab) - 1.0
    gap = logits.amax(-1, keepdim=True).float() - logits.gather(-1, tokens).float()
    return (gap < limit)[..., 0]
