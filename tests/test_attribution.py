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
    cases = cases_for(["fixtures.mutants.dflash_vocabulary:DFlashTruncatedVocabQ"], "none", None, "step", "iid8")
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
