"""Who caused an exact failure: the installed verifier's own acceptance rule, or the generator.

An emitted token the target gives probability 0 is an exact failure, but not always the generator's.
Algorithm 1 accepts a draft ``x`` with probability ``min(1, p(x)/q(x))``: 0 when ``p(x) = 0``, whatever
``q`` the generator returned. An **accepted draft with target probability 0** is therefore the
verifier's doing: transformers 5.x accepts when ``r <= p/q`` and float32 ``torch.rand`` returns exactly
0 with probability ``2^-24`` (``lossless-check verifier``), so every such draft that reaches the
verifier is emitted with probability exactly ``2^-24``. The residual and the bonus token have no
mass where ``p = 0``, so every other token outside the support (and an impossible draft, a stopping
violation) stays the generator's.

Such trials are **set aside** from the generator's law tests and counted, with their cause, in the
case's ``exact_failures``. Why the tests stay valid: couple the installed verifier with the strict
one (``r < p/q``) on the same ``r``. They decide alike except where ``r`` equals a ratio exactly; at a
zero-probability draft that is the event ``E`` (``r = 0``), which sets the trial aside, so a kept
trial is distributed as a strict verifier's trial given ``not E``. The strict verifier rejects a
zero-probability draft whatever ``r`` is, so ``P(E | output) = 2^-24`` when the trial's rejected draft
had ``p = 0`` and 0 otherwise: conditioning on ``not E`` reweights each output by a factor within
``[1 - 2^-24, 1 / (1 - 2^-24)]`` per verification round. A trial of ``K`` rounds (a ``generate()``
call of generate mode makes up to ``K = max_new_tokens`` of them; a step-mode trial is one round) has
``P(E | output) <= 1 - (1 - 2^-24)^K <= K 2^-24``, so a lossless generator's ``n`` kept trials have a
likelihood ratio to the lossless law within ``(1 - K 2^-24)^-n`` of 1, and any test at level
``alpha`` keeps level ``alpha (1 - K 2^-24)^-n`` (:func:`kept_level`: ``1.0003 alpha`` for 5,000
step trials, ``1.0012 alpha`` for 5,000 generate calls of ``K = 4``) -- beside the float32 grid's own
rounding of every ratio ``p/q`` (under ``2^-24`` per draft), which every verifier has.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from typing import Callable

import numpy as np
import torch

#: The causes an exact failure is attributed to.
VERIFIER, GENERATOR = "verifier", "generator"
RATE = 2.0**-24


def kept_level(alpha: float, trials: int, rounds: int = 1) -> float:
    """The level a test at ``alpha`` keeps on ``trials`` kept trials of up to ``rounds`` verification
    rounds each: ``alpha (1 - rounds 2^-24)^-trials`` (module docstring)."""
    return alpha * math.exp(-trials * math.log1p(-rounds * RATE))


def accepted_impossible(emitted: np.ndarray, n_matches: np.ndarray, law_of: Callable) -> np.ndarray:
    """Per trial, the first position (0-based) of an accepted draft whose target probability given its
    prefix is 0, else -1. ``emitted[t, :n_matches[t]]`` are trial ``t``'s accepted drafts."""
    first = np.full(len(emitted), -1, dtype=np.int64)
    laws: dict[tuple, np.ndarray | None] = {}
    for t in np.flatnonzero(n_matches > 0):
        row = emitted[t].tolist()
        for j in range(int(n_matches[t])):
            prefix = tuple(row[:j])
            if prefix not in laws:
                laws[prefix] = law_of(prefix)
            law = laws[prefix]
            if law is not None and law[row[j]] <= 0:
                first[t] = j
                break
    return first


def without(observations, mask: np.ndarray):
    """``observations`` (a dataclass of per-trial arrays) without the trials where ``mask`` is True."""
    keep = ~mask
    trials = len(mask)
    changes = {f.name: getattr(observations, f.name)[keep] for f in dataclasses.fields(observations)
               if isinstance(getattr(observations, f.name), np.ndarray) and len(getattr(observations, f.name)) == trials}
    if hasattr(observations, "seconds") and trials:
        changes["seconds"] = observations.seconds * int(keep.sum()) / trials
    return dataclasses.replace(observations, **changes)


def verifier_entries(first_positions: np.ndarray, trials: int = 0, rounds: int = 1) -> list[dict]:
    """``exact_failures`` entries for the set-aside trials: one per position, with the count and rate,
    and ``level_factor``, what setting trials aside multiplies the level of the law tests by
    (:func:`kept_level` over the ``trials`` kept trials of up to ``rounds`` rounds each)."""
    from lossless_check.subjects.verifier import acceptance_line

    flagged = first_positions[first_positions >= 0]
    if not flagged.size:
        return []
    source, line, text = acceptance_line()
    return [{"check": "support", "cause": VERIFIER, "position": int(j) + 1, "trials": int((flagged == j).sum()),
             "rate": RATE, "level_factor": kept_level(1.0, trials, rounds), "where": f"{source}:{line}", "rule": text,
             "why": "accepted draft with target probability 0 (probability 0 under the algorithm's law)"}
            for j in np.unique(flagged)]


def generator_entries(result, impossible: int = 0, stopping: int = 0) -> list[dict]:
    """``exact_failures`` entries the generator's own evidence gives: support violations by position
    (from ``result.positions``), impossible drafts, stopping violations."""
    entries = [{"check": "support", "cause": GENERATOR, "position": p["position"], "trials": p["support_violations"]}
               for p in result.positions if p.get("support_violations")]
    if impossible:
        entries.append({"check": "impossible_draft", "cause": GENERATOR, "trials": int(impossible)})
    if stopping:
        entries.append({"check": "stopping", "cause": GENERATOR, "trials": int(stopping)})
    return entries


def attribute(result, set_aside: np.ndarray, impossible: int = 0, stopping: int = 0, rounds: int = 1):
    """Fill ``result.exact_failures`` (verifier-caused first) and ``result.verifier_set_aside``; return
    ``result``. ``rounds``: the most verification rounds a trial makes (``K`` in generate mode)."""
    kept = int((set_aside < 0).sum())
    result.exact_failures = verifier_entries(set_aside, kept, rounds) + generator_entries(result, impossible, stopping)
    result.verifier_set_aside = int((set_aside >= 0).sum())
    result.reason = result.explain()
    return result


@contextmanager
def watching_verifier(prompt_length: int):
    """While ``generate()`` runs, wrap the installed ``_speculative_sampling`` (the global that
    ``_assisted_decoding`` calls) to see what it accepted: every call that accepts a draft its own ``p``
    (``new_logits.softmax(-1)``, the very tensor it computes p from) gives probability 0 appends that
    draft's output position (0-based, from the prompt's end) to the yielded list. Nothing else changes.
    A zero the loop's ``p`` does not have (a loop that built the target's logits wrongly) stays the
    generator's: the check is on what the verifier saw."""
    import transformers.generation.utils as utils

    real = utils._speculative_sampling
    seen: list[int] = []

    def watched(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs):
        tokens, n_matches = real(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs)
        accepted = int(n_matches)
        if accepted:
            drafts = candidate_input_ids[0, -candidate_length:][:accepted]
            p = new_logits.softmax(dim=-1)[0, :accepted].gather(-1, drafts[:, None])[:, 0]
            zero = torch.nonzero(p == 0)
            if zero.numel():
                seen.append(candidate_input_ids.shape[1] - candidate_length - prompt_length + int(zero[0, 0]))
        return tokens, n_matches

    utils._speculative_sampling = watched
    try:
        yield seen
    finally:
        utils._speculative_sampling = real
