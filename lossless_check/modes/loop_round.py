"""Step mode for a generator that returns no q: each trial is the first round of the real loop.

With ``candidate_logits`` ``None`` (prompt lookup, a user's generator that only proposes tokens),
``_assisted_decoding`` never calls ``_speculative_sampling``: it samples the target at every candidate
position itself and keeps the drafts that match its draws, plus its draw at the first position that
does not match (or after the last draft). That branch lives inside the loop, so it is not rebuilt
here: a trial is the unmodified call
``target.generate(prompt, generation_config=config, stopping_criteria=one_round(...), **kwargs)``, with
the models and arguments that make ``generate()`` build the case's generator (:mod:`.loop_models`: the
built-in, a subclass, or a user's factory), stopped after its first round by :func:`one_round`, a
stopping criterion (the loop consults its criteria after every round). The trial records the round's
emitted tokens, the draft length ``get_candidates`` returned, and the matches (emitted tokens less one).

The law: the round emits the target's draws ``y_1 .. y_{n+1}``, ``n`` the number of leading drafts
they match. Position ``j`` is reached when ``y_1 .. y_{j-1}`` matched the drafts; given that, ``y_j``
follows ``p_j(. | prefix)`` exactly when the target's draws are fresh and independent of the drafts.
So step mode's per-position law tests apply unchanged (strata by exact law, the laws of
:class:`~lossless_check.laws.expected.ExactLaws`), and they see what breaks that independence: draws
that repeat (a generator that re-seeds the global stream), drafts chosen knowing the coming draws (a
selection of which draws are kept), a target cache the generator corrupted. What one round cannot
see (a state carried to later rounds) is generate mode's to see. The theory of step mode's
diagnostics (the acceptance law from ``min(p, q)``, the ``[p - q]+`` residuals) is that of a
verified q, and does not apply here.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from lossless_check.core.compat import loop_eos, release_warpers
from lossless_check.core.errors import GeneratorFailure
from lossless_check.evidence.results import one_line
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.modes import loop_models
from lossless_check.modes.observations import Observations, widen
from lossless_check.modes.randomness import OwnRandomness, seed_streams
from lossless_check.subjects.adapters import DraftContext
from lossless_check.subjects.candidates import check_candidates

#: What a case's ``batch.note`` says of its trials.
ROUND_NOTE = "batch 1: returns no q, each trial one real round of generate() (the loop samples the target itself)"


def no_q(candidate_ids: torch.Tensor, candidate_logits: torch.Tensor | None, prompt_length: int) -> bool:
    """Whether a call returned no q to verify: ``candidate_logits`` ``None``, or no draft at all."""
    return candidate_logits is None or candidate_ids.shape[1] == prompt_length


def one_round(candidates: list[torch.Tensor]):
    """A ``StoppingCriteriaList`` that stops ``generate()`` after its first round.

    Every row is done at every call but one: releases up to 5.17 also ask the criteria of the
    candidate itself before verifying it (``is_done_candidate``: a candidate that meets one keeps one
    token less), and a candidate ``get_candidates`` returned (``candidates``) is not done. The
    sequence after a round equals its candidate only where the loop cropped it at ``max_length`` or at
    an EOS (it holds one token more than the drafts it kept, and the first draft it did not keep
    differs from the target's draw there), and there the length and EOS criteria end it.
    """
    from transformers import StoppingCriteria, StoppingCriteriaList

    def is_candidate(input_ids: torch.Tensor) -> bool:
        return any(c is input_ids or (c.shape == input_ids.shape and torch.equal(c.to(input_ids.device), input_ids))
                   for c in candidates)

    class OneRound(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            done = not is_candidate(input_ids)
            return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([OneRound()])


class LoopRounds:
    """The trials of a step case whose generator returns no q: first rounds of the real loop.

    ``ctx`` is the step case's :class:`DraftContext` (the rounds run on a target stub of their own,
    whose class is swapped to route ``generate()``); ``max_new_tokens`` the case's budget (step mode's,
    far past a round); ``own_randomness`` watches each ``get_candidates`` call, as batch-1 calls of
    step mode are.
    """

    def __init__(self, ctx: DraftContext, case, max_new_tokens: int, own_randomness: OwnRandomness):
        from transformers import GenerationConfig

        scenario = case.scenario
        self.scenario = scenario
        self.prompt_ids = ctx.prompt_ids
        self.own_randomness = own_randomness
        target = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
        try:
            self.models = loop_models.loop_models(case.generator.adapter.name, replace(ctx, target=target))
        except Exception as exc:  # building the generator's models failed
            raise GeneratorFailure(f"building the generator raised {one_line(exc)}") from exc
        self.config = GenerationConfig(do_sample=True, max_new_tokens=max_new_tokens, **release_warpers(case.warpers))
        loop_eos(self.config, scenario.vocab_size)
        for key, value in self.models.config_fields.items():
            setattr(self.config, key, value)
        self._drafts: list[int] = []
        self._candidates: list[torch.Tensor] = []
        self._watch(self.models.target, max_length=self.prompt_ids.shape[1] + max_new_tokens)

    def _watch(self, target, max_length: int) -> None:
        """Swap ``target``'s class for a subclass whose ``_get_candidate_generator`` returns what the
        route builds (``generate()`` itself, a subclass, a factory) with its ``get_candidates`` watched:
        checked against the candidate contract, its draft length recorded. The instance attribute only
        observes: the loop calls the generator's own method through it."""
        base, vocab, own_randomness = type(target), self.scenario.vocab_size, self.own_randomness
        drafts, candidates = self._drafts, self._candidates

        def _get_candidate_generator(model, *args, **kwargs):
            generator = base._get_candidate_generator(model, *args, **kwargs)
            own = generator.get_candidates

            def get_candidates(input_ids, *args, **kwargs):
                with own_randomness.watching() as drafted:
                    candidate_ids, candidate_logits = own(input_ids, *args, **kwargs)
                    drafted(candidate_ids)
                check_candidates(input_ids, candidate_ids, candidate_logits, vocab, max_length)
                drafts.append(candidate_ids.shape[1] - input_ids.shape[1])
                candidates.append(candidate_ids)
                return candidate_ids, candidate_logits

            generator.get_candidates = get_candidates
            return generator

        target.__class__ = type(f"{base.__name__}Watched", (base,), {"_get_candidate_generator": _get_candidate_generator})

    def round(self) -> list[int]:
        """One trial: the tokens the first round of ``generate()`` emits."""
        self._drafts.clear()
        self._candidates.clear()
        try:
            out = self.models.target.generate(self.prompt_ids, generation_config=self.config,
                                              stopping_criteria=one_round(self._candidates), **self.models.generate_kwargs)
        except GeneratorFailure:
            raise
        except Exception as exc:  # the generator under test (or the loop around it) failed
            raise GeneratorFailure(f"generate() raised {one_line(exc)}") from exc
        return out[0, self.prompt_ids.shape[1]:].tolist()

    def collect(self, samples: int, seed: int, width: int) -> Observations:
        """``samples`` trials from ``seed`` (torch's, numpy's and Python's streams, as every chunk);
        ``emitted`` at least ``width`` columns wide."""
        seed_streams(seed)
        emitted = np.full((samples, width), -1, dtype=np.int64)
        n_matches = np.zeros(samples, dtype=np.int64)
        drafts = np.zeros(samples, dtype=np.int64)
        started = time.perf_counter()
        with torch.no_grad():
            for t in range(samples):
                tokens = self.round()
                if len(tokens) > emitted.shape[1]:
                    emitted = widen(emitted, len(tokens))
                emitted[t, : len(tokens)] = tokens
                n_matches[t] = max(len(tokens) - 1, 0)
                drafts[t] = self._drafts[0] if self._drafts else 0
        nothing = np.zeros(samples, dtype=np.int64)
        return Observations(emitted, n_matches, drafts, nothing, nothing.astype(bool), time.perf_counter() - started)


__all__ = ["ROUND_NOTE", "LoopRounds", "no_q", "one_round"]
