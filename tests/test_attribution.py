"""Exact failures name their cause: an accepted draft of target probability 0 is the verifier's.

transformers 4.37.0-5.24.0 accept a draft when ``r <= p/q``; float32 ``torch.rand`` returns 0 with
probability 2^-24, and then a draft with ``p = 0`` is emitted. Here ``r = 0`` is forced at the first few
such drafts of a step-mode run (``torch.rand_like`` patched while the installed verifier runs): the
generator, a lossless built-in, stays ``lossless`` and the trials are set aside with the verifier named
as cause. Controls: without the attribution the same run is ``not_lossless`` (the old verdict, blaming
the generator), and a mutant whose own q is wrong is ``not_lossless`` with cause ``generator``. Where
the installed verifier is strict (5.25.0 on), the forced ``r = 0`` is rejected: nothing is set aside and
the run is ``lossless`` with or without the attribution.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.forced_draws import force_r_0_at_impossible_drafts
from fixtures.releases import (
    ASSISTED_DRAFTS_GREEDILY,
    DFLASH,
    VERIFIER_ACCEPTS_AT_R_0,
    needs,
    verifier_rule_line,
    within,
)
from lossless_check.faces.api import cases_for, run_cases

FORCED = 3
ACCEPTS_AT_R_0 = within(VERIFIER_ACCEPTS_AT_R_0)
SET_ASIDE = FORCED if ACCEPTS_AT_R_0 else 0
pytestmark = pytest.mark.skipif(within(ASSISTED_DRAFTS_GREEDILY), reason="the built-in Assisted of this release "
                                "drafts greedily and is not lossless: no lossless run to attribute within")


@pytest.fixture
def r_zero_at_impossible_drafts(monkeypatch):
    """``r = 0`` wherever the verifier's first ratio is 0 (a first draft with p = 0), ``FORCED`` times."""
    return force_r_0_at_impossible_drafts(monkeypatch, FORCED)


def _assisted_top_k3(samples=1000, batch_size=None):
    cases = cases_for(["AssistedCandidateGenerator"], "top_k=3", None, "step", "markov8")
    return run_cases(cases, samples, 1e-6, 0, batch_size=batch_size).cases[0]


def test_forced_r_0_is_attributed_to_the_verifier(r_zero_at_impossible_drafts):
    result = _assisted_top_k3()
    assert len(r_zero_at_impossible_drafts) == FORCED
    assert result.verdict == "lossless", result.reason
    assert result.verifier_set_aside == SET_ASIDE and result.samples == 1000 - SET_ASIDE
    if not ACCEPTS_AT_R_0:
        assert result.exact_failures == []
        return
    [entry] = result.exact_failures
    assert entry["cause"] == "verifier" and entry["check"] == "support" and entry["position"] == 1
    assert entry["trials"] == FORCED and entry["rate"] == 2.0**-24
    assert entry["rule"] == "is_accepted = r_i <= probability_ratio"
    assert entry["where"].endswith(f"utils.py:{verifier_rule_line()}")
    assert "set aside, caused by the verifier" in result.reason


def test_without_attribution_the_same_run_blames_the_generator(r_zero_at_impossible_drafts, monkeypatch):
    """Negative control: the set-aside is what keeps the generator's verdict honest. At batch 1: batched
    rows never fail a case (a batched failure reruns it at batch 1, where the forced draws are spent)."""
    from lossless_check.modes import step_run

    monkeypatch.setattr(step_run, "accepted_impossible", lambda emitted, *_: np.full(len(emitted), -1))
    result = _assisted_top_k3(batch_size=1)
    if not ACCEPTS_AT_R_0:
        assert result.verdict == "lossless" and result.exact_failures == [], result.reason
        return
    assert result.verdict == "not_lossless" and "support" in result.failed_checks
    assert [e["cause"] for e in result.exact_failures] == ["generator"]


@needs(DFLASH)
def test_a_generator_with_a_wrong_q_stays_not_lossless_with_cause_generator():
    cases = cases_for(["lossless_check.mutants.dflash_vocabulary:DFlashTruncatedVocabQ"], "none", None, "step", "iid8")
    result = run_cases(cases, 1000, 1e-6, 0).cases[0]
    assert result.verdict == "not_lossless" and "impossible_draft" in result.failed_checks
    assert result.verifier_set_aside == 0
    assert {(e["check"], e["cause"]) for e in result.exact_failures} >= {("impossible_draft", "generator")}


def _assisted_generate_top_k3():
    cases = cases_for(["AssistedCandidateGenerator"], "top_k=3", None, "generate", "markov8", max_new_tokens=3)
    return run_cases(cases, 300, 1e-6, 0).cases[0]  # 300 calls: power 0.99 at TV 0.29 (a lossless claim)


def test_generate_mode_attributes_forced_r_0_to_the_verifier(r_zero_at_impossible_drafts):
    """The real generate() loop: the installed verifier is watched while it runs (its own p), so the
    sample it made emit a zero-probability draft is set aside with the verifier as cause."""
    result = _assisted_generate_top_k3()
    assert len(r_zero_at_impossible_drafts) == FORCED
    assert result.verdict == "lossless", result.reason
    assert result.verifier_set_aside == SET_ASIDE and result.samples == 300 - SET_ASIDE
    assert {e["cause"] for e in result.exact_failures} == ({"verifier"} if ACCEPTS_AT_R_0 else set())


def test_generate_mode_without_watching_the_verifier_blames_the_generator(r_zero_at_impossible_drafts, monkeypatch):
    """Negative control of the generate-mode attribution."""
    import contextlib

    from lossless_check.modes import generate

    monkeypatch.setattr(generate, "watching_verifier", lambda prompt_length: contextlib.nullcontext([]))
    result = _assisted_generate_top_k3()
    if not ACCEPTS_AT_R_0:
        assert result.verdict == "lossless" and result.exact_failures == [], result.reason
        return
    assert result.verdict == "not_lossless" and "support" in result.failed_checks
    assert {e["cause"] for e in result.exact_failures} == {"generator"}


# -- the level the error-rate sentences state (README, docs/guarantee.md#error-rates) ---------------------


def _forced_r(value: float, monkeypatch) -> None:
    """Every ``torch.rand_like`` of the verifier returns ``value``."""
    monkeypatch.setattr(torch, "rand_like", lambda like, *args, **kwargs: torch.full_like(like, value))


def _first_draft_impossible():
    """One round: the first draft has target probability 0 (q > 0), the second is likely under both."""
    candidates = torch.tensor([[3, 1, 2, 0]])
    q = torch.tensor([[[0.0, 0.0, 3.0, 0.0], [3.0, 0.0, 0.0, 0.0]]])
    p = torch.tensor([[[1.0, 1.0, float("-inf"), 1.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    return candidates, q, p


def test_the_installed_verifier_accepts_a_zero_probability_draft_exactly_at_r_0(monkeypatch):
    """The event the stated factor pays for, on the installed verifier: a draft of p = 0 is accepted at
    r = 0 (4.37-5.24) and at no other value of float32 ``rand``'s grid (the smallest positive one, 2^-24,
    rejects it): its probability is P(r = 0) = 2^-24 (the grid itself: ``lossless-check verifier``'s
    premise). From 5.25 on it is accepted nowhere."""
    from lossless_check.core.compat import speculative_sampling
    from lossless_check.subjects.verifier import rand_grid

    assert rand_grid().passed
    candidates, q, p = _first_draft_impossible()
    accepted = {}
    for r in (0.0, 2.0 ** -24):
        _forced_r(r, monkeypatch)
        accepted[r] = int(speculative_sampling()(candidates, q, 2, p.clone())[1]) > 0
    assert accepted == {0.0: ACCEPTS_AT_R_0, 2.0 ** -24: False}


def test_the_stated_level_factors_are_the_attribution_level():
    """The factors the error-rate sentences state are :func:`kept_level`'s at their sizes (1.0003 at 5,000
    step trials, 1.0012 at 5,000 calls of K = 4), which covers K rounds a trial: a generate call of K rounds,
    each with a zero-probability draft at the verifier, keeps a trial with probability (1 - 2^-24)^K, and
    the level stated before (one round a trial) falls short of that worst case."""
    import re
    from pathlib import Path

    from lossless_check.evidence.attribution import RATE, kept_level

    alpha, n, k = 1e-6, 5000, 4
    assert round(kept_level(alpha, n, 1) / alpha, 4) == 1.0003 and round(kept_level(alpha, n, k) / alpha, 4) == 1.0012
    worst = alpha / (1 - RATE) ** (k * n)
    assert kept_level(alpha, n, k) >= worst
    assert kept_level(alpha, n, 1) < worst  # the old statement, alpha (1 - 2^-24)^-n, falls short
    root = Path(__file__).resolve().parents[1]
    for page in ("README.md", "docs/guarantee.md"):
        text = " ".join((root / page).read_text().split())
        sentence = re.search(r"\*\*[^*]*probability that the run reports any case `not_lossless` is at most[^*]*\*\*",
                             text).group(0)
        assert "(1 - K 2^-24)^-n" in sentence, (page, sentence)
        assert "1.0003" in text and "1.0012" in text, page
