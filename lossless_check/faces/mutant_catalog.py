"""The mutation catalog: mutant generators, each reproducing a real bug class, with the q it returns
in place of the law its drafts were drawn from. :mod:`lossless_check.faces.mutation` runs them.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import numpy as np

from lossless_check.laws.expected import ExactLaws
from lossless_check.subjects.adapters import resolve_generator

#: ``(laws, prefix) -> (q_sampled, q_returned)``: the law a mutant draws the draft after ``prefix``
#: from, and the law its returned logits claim, both over the processed vocabulary.
DraftModel = Callable[[ExactLaws, tuple], tuple[np.ndarray, np.ndarray]]


DFLASH, ASSISTED = "DFlashTokenCandidateGenerator", "AssistedCandidateGenerator"


class Mutant(NamedTuple):
    """One catalog entry. ``family``: the built-in generator class the mutant subclasses (a release
    without it cannot run the mutant); ``position``: first output position (1-based) the bug reaches.
    ``mode="greedy"`` (:data:`GREEDY_MUTANTS`): the mutant's greedy row runs every greedy stack, and
    ``warpers`` is what every stack whose output differs must hold. ``since``: ``(release, why)`` where
    the bug class only reaches the loop from that release on (before it the mutant is not run)."""

    spec: str
    family: str
    warpers: dict[str, Any]
    scenario: str
    equivalent: bool
    bug: str
    position: int = 1
    drafts: DraftModel | None = None
    mode: str = "step"
    since: tuple[str, str] | None = None


def _softmax(logits: np.ndarray) -> np.ndarray:
    weights = np.exp(logits - np.max(logits))
    return weights / weights.sum()


def _raw(laws: ExactLaws, prefix: tuple) -> np.ndarray:
    """The drafter's unprocessed law after ``prefix``."""
    history = laws.scenario.prompt + prefix
    return _softmax(laws.scenario.drafter.logits(len(prefix), history[-1]))


def _renormalised(q: np.ndarray, support: np.ndarray) -> np.ndarray:
    kept = np.where(support, q, 0.0)
    return kept / kept.sum()


def _raw_logits(laws, prefix):
    return laws.drafter(prefix), _raw(laws, prefix)


def _greedy(laws, prefix):
    q = laws.drafter(prefix)
    return np.eye(len(q))[np.argmax(q)], q


def _shifted(laws, prefix):
    # The next draft's q; which token extends the prefix is irrelevant under history-free warpers.
    return laws.drafter(prefix), laws.drafter(prefix + (0,))


def _draft_temperature_not_in_q(laws, prefix):
    temperature = resolve_generator(DRAFT_TEMPERATURE_NOT_IN_Q).generator_class.draft_temperature
    raw = _raw(laws, prefix)  # registered without warpers: the processed law is the raw one
    return _softmax(np.log(raw) / temperature), raw


def _permuted(laws, prefix):
    q = laws.drafter(prefix)
    return q, np.roll(q, 1)


def _truncated(laws, prefix):
    q = laws.drafter(prefix)
    return q, _renormalised(q, np.arange(len(q)) < len(q) - 1)


def _wider_support(laws, prefix):
    q, raw = laws.drafter(prefix), _raw(laws, prefix)
    support = q > 0
    support[np.argmax(np.where(support, -1.0, raw))] = True
    return q, _renormalised(raw, support)


def _ignores_repetition_penalty(laws, prefix):
    # Registered with the repetition penalty as the only processor that changes anything.
    return _raw(laws, prefix), laws.drafter(prefix)


RAW = "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits"


DRAFT_TEMPERATURE_NOT_IN_Q = "lossless_check.mutants.dflash_draft_temperature:DFlashDraftTemperatureNotInQ"


_RAW_BUG = "samples from the processed logits, returns the raw logits as q"


MUTANTS: list[Mutant] = [
    Mutant(RAW, DFLASH, {"top_k": 2}, "iid8", False, _RAW_BUG + " (top-k)", drafts=_raw_logits),
    Mutant(RAW, DFLASH, {"top_p": 0.7}, "iid8", False, _RAW_BUG + " (top-p)", drafts=_raw_logits),
    Mutant(RAW, DFLASH, {"min_p": 0.35}, "iid8", False, _RAW_BUG + " (min-p)", drafts=_raw_logits),
    Mutant(RAW, DFLASH, {"temperature": 0.5}, "iid8", False, _RAW_BUG + " (temperature)", drafts=_raw_logits),
    Mutant("lossless_check.mutants.dflash_greedy_draft:DFlashGreedyDraft", DFLASH, {}, "iid8", False,
           "drafts the argmax, returns the softmax as q", drafts=_greedy),
    Mutant("lossless_check.mutants.assisted_greedy_draft:AssistedGreedyDraft", ASSISTED, {}, "iid8", False,
           "assistant decodes greedily (do_sample=False), its scores returned as q", drafts=_greedy),
    Mutant("lossless_check.mutants.dflash_shifted_q:DFlashShiftedQ", DFLASH, {}, "markov8", False,
           "q of draft i is the q of draft i+1 (off by one position)", drafts=_shifted),
    Mutant(DRAFT_TEMPERATURE_NOT_IN_Q, DFLASH, {}, "iid8", False,
           "private draft temperature applied to the draft, not to q", drafts=_draft_temperature_not_in_q),
    Mutant("lossless_check.mutants.dflash_vocabulary:DFlashPermutedVocabQ", DFLASH, {}, "iid8", False,
           "q over a permuted vocabulary (ids off by one)", drafts=_permuted),
    Mutant("lossless_check.mutants.dflash_vocabulary:DFlashTruncatedVocabQ", DFLASH, {}, "iid8", False,
           "q over a truncated vocabulary (last token -inf in q only)", drafts=_truncated),
    Mutant("lossless_check.mutants.dflash_vocabulary:DFlashQOverWiderSupport", DFLASH, {"top_k": 2}, "iid8", False,
           "q renormalised over one token more than the drafter samples from", drafts=_wider_support),
    Mutant("lossless_check.mutants.dflash_repetition_penalty:DFlashDraftIgnoresRepetitionPenalty", DFLASH,
           {"repetition_penalty": 3.0}, "markov8", False,
           "drafts ignore the (history-dependent) repetition penalty that q applies",
           drafts=_ignores_repetition_penalty),
    Mutant("lossless_check.mutants.dflash_later_drafts:DFlashRawQAfterFirstDraft", DFLASH, {"temperature": 0.5}, "iid8",
           False,
           "q processed for the first draft only, raw from the second on", position=2, drafts=_raw_logits),
    Mutant("lossless_check.mutants.dflash_draft_temperature:DFlashDraftTemperature", DFLASH, {}, "iid8", True,
           "private draft temperature, applied to q too"),
    Mutant("lossless_check.mutants.dflash_equivalent:DFlashLogSoftmaxQ", DFLASH, {"top_k": 2}, "iid8", True,
           "returns log_softmax of the processed logits"),
    Mutant("lossless_check.mutants.dflash_equivalent:DFlashOffsetQ", DFLASH, {"repetition_penalty": 3.0}, "markov8",
           True,
           "adds a constant to every logit of q"),
    Mutant("lossless_check.mutants.dflash_equivalent:DFlashFloat64Q", DFLASH, {"top_p": 0.7}, "iid8", True,
           "returns the processed logits in float64"),
]


GREEDY_MUTANTS: list[Mutant] = [
    Mutant("lossless_check.mutants.greedy_mutants:AssistedDraftsWithoutRepetitionPenalty", ASSISTED,
           {"repetition_penalty": 2.0}, "markov8", False,
           "drops the repetition penalty from the target's own processor list (in place, meaning the drafts')",
           mode="greedy",
           # Before 4.57.0 generate() hands the generator the user's processor list (4.56.2
           # generation/utils.py line 2478), not the one it verifies with: the mutant changes nothing.
           since=("4.57.0", "a generator handed the processor list the loop verifies with")),
    Mutant("lossless_check.mutants.greedy_mutants:AssistedDraftsUnrelatedTokens", ASSISTED, {}, "markov8", True,
           "drafts unrelated tokens, no q: rejected drafts cost rounds, never tokens", mode="greedy"),
]
