"""Provenance mode: real generators are consistent, the raw-logits mutant is caught in one call."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from transformers.generation import candidate_generator

from fixtures.releases import (
    ASSISTED_DRAFTS_GREEDILY,
    EARLY_EXIT_OMITS_FIRST_ITERATION,
    INSTALLED,
    MTP_RETURNS_RAW_LOGITS,
    assisted_samples,
    needs,
    within,
)
from lossless_check.subjects.adapters import ADAPTERS, ResolvedGenerator, resolve_generator
from lossless_check.modes.interception import ARGMAX, SAMPLE, Draw
from lossless_check.modes.provenance import (
    compare_row, disagreement, match_draws, provenance_check, run_provenance_case,
)
from lossless_check.modes.interception import NOISE, TOLERANCE, Interception
from lossless_check.modes.step import StepCase
from lossless_check.evidence.results import Case
from lossless_check.laws.scenarios import DEFAULT, IID

MUTANT = "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits"
DFLASH = "DFlashTokenCandidateGenerator"
#: Generators whose q is their drafts' law on the installed release (DFlash where it exists).
GENERATORS = [pytest.param(DFLASH, marks=needs(DFLASH))] + (
    [] if within(ASSISTED_DRAFTS_GREEDILY) else ["AssistedCandidateGenerator"])


@pytest.mark.parametrize("warpers", [{"top_k": 3}, {"temperature": 0.7}, {}], ids=str)
@pytest.mark.parametrize("generator", GENERATORS)
def test_builtin_generators_are_consistent(generator, warpers):
    result = provenance_check(Case(resolve_generator(generator), warpers, scenario=DEFAULT))
    assert result.verdict == "consistent", result.reason
    assert [p.position for p in result.positions] == [1, 2, 3]
    for p in result.positions:
        assert p.rule == "sampled" and p.tv <= TOLERANCE and p.foreign_mass == 0
        assert p.inflation == pytest.approx(1, abs=1e-6)


@needs(DFLASH)
def test_raw_logits_mutant_is_inconsistent_in_one_call():
    result = provenance_check(Case(resolve_generator(MUTANT), {"top_k": 3}, scenario=IID), trials=1)
    assert result.verdict == "inconsistent", result.reason
    # The drafter samples from top-3 of the raw table; the raw softmax keeps mass Z on those 3.
    raw = torch.softmax(torch.tensor(IID.drafter.rows[0]), -1).numpy()
    z = np.sort(raw)[-3:].sum()
    for p in result.positions:
        assert not p.consistent
        assert p.foreign_mass == pytest.approx(1 - z, abs=1e-6) and p.foreign_mass > 0
        assert p.inflation == pytest.approx(1 / z, rel=1e-6) and p.inflation > 1
    assert "inflated" in result.reason


@pytest.mark.parametrize("generator", GENERATORS)
def test_interception_changes_no_output_and_no_random_stream(generator):
    step = StepCase(Case(resolve_generator(generator), {"top_k": 3}, scenario=DEFAULT))
    multinomial = torch.multinomial

    def drafts(intercept):
        session = step.case.generator.adapter.session(step.context())
        torch.manual_seed(11)
        out = []
        with torch.no_grad():
            for _ in range(3):
                if intercept:
                    with Interception(DEFAULT.vocab_size):
                        out.append(session.draft(step.prompt_ids))
                else:
                    out.append(session.draft(step.prompt_ids))
        return out, torch.get_rng_state()

    (plain, plain_state), (seen, seen_state) = drafts(False), drafts(True)
    for (ids_a, logits_a), (ids_b, logits_b) in zip(plain, seen):
        assert torch.equal(ids_a, ids_b) and torch.equal(logits_a, logits_b)
    assert torch.equal(plain_state, seen_state)
    assert torch.multinomial is multinomial and "argmax" not in torch.Tensor.__dict__  # patches undone


@needs(DFLASH)
def test_greedy_drafts_are_traced_to_argmax():
    step = StepCase(Case(resolve_generator("DFlashTokenCandidateGenerator"), {"top_k": 3}, scenario=IID))
    config = copy.deepcopy(step.generation_config)
    config.do_sample = False
    session = step.case.generator.adapter.session(dataclasses.replace(step.context(), generation_config=config))
    with torch.no_grad(), Interception(IID.vocab_size) as seen:
        ids, logits = session.draft(step.prompt_ids)
    matched = match_draws(seen.draws, ids[0, 3:].tolist())
    assert [d.kind for d in matched] == [ARGMAX] * 3
    q = torch.softmax(logits[0, 0], -1)
    assert not compare_row(matched[0], q, 1).consistent  # top-3 q is not a point mass
    assert compare_row(matched[0], torch.nn.functional.one_hot(ids[0, 3], IID.vocab_size).float(), 1).consistent


def _row(*probs):
    return torch.tensor(probs, dtype=torch.float64)


@pytest.mark.parametrize("draws, drafts, gap", [
    ([Draw(SAMPLE, 1, _row(0, 1))], [1], None),
    ([Draw(ARGMAX, 1), Draw(SAMPLE, 1, _row(0, 1))], [1], None),  # a processor's argmax is not a draft
    ([Draw(SAMPLE, 0, _row(1, 0))], [1], "not produced"),
    ([Draw(ARGMAX, 1), Draw(ARGMAX, 1)], [1], "unambiguously"),
    ([Draw(SAMPLE, 0, _row(1, 0)), Draw(SAMPLE, 1, _row(0, 1))], [1], "drawn but not drafted"),
    ([Draw(NOISE), Draw(ARGMAX, 1)], [1], "Gumbel"),
])
def test_matching_reports_gaps_instead_of_guessing(draws, drafts, gap):
    matched = match_draws(draws, drafts)
    if gap is None:
        assert [d.token for d in matched] == drafts
    else:
        assert isinstance(matched, str) and gap in matched


class Gumbel:
    """Redraws its drafts by Gumbel-max through ``Tensor.max``, a primitive provenance does not trace."""

    def get_candidates(self, input_ids, **kwargs):
        candidate_ids, logits = super().get_candidates(input_ids, **kwargs)
        gumbel = -torch.empty_like(logits).exponential_().log()
        candidate_ids[:, input_ids.shape[1]:] = (logits + gumbel).max(-1).indices
        return candidate_ids, logits


@needs(DFLASH)
def test_untraceable_sampler_is_a_gap_not_a_verdict():
    gumbel_dflash = type("GumbelDFlash", (Gumbel, getattr(candidate_generator, DFLASH)), {})
    generator = ResolvedGenerator("GumbelDFlash", ADAPTERS[DFLASH], gumbel_dflash)
    result = provenance_check(Case(generator, {"top_k": 3}, scenario=IID), trials=2)
    assert result.verdict == "gap" and "interception gap" in result.reason
    # In a run: skipped with the gap as its reason (neither a pass nor the generator's error).
    row = run_provenance_case(Case(generator, {"top_k": 3}, "provenance", IID), seed=0)
    assert row.verdict == "skipped" and row.reason.startswith("interception gap"), row.reason


#: Drafters that draw from the law they return, but not freshly (fixtures/mutants/private_randomness.py:
#: the same drafts on every batch-1 call, not_lossless in step mode), and what gives each away here.
NOT_FRESH = {"PrivateGenerator": "builds a private torch.Generator", "RestoresRngState": "set_rng_state",
             "ReseededPrivateStream": "fork_rng", "SeedBoundAtImport": "without advancing torch's global stream"}


@assisted_samples()
@pytest.mark.parametrize("name", sorted(NOT_FRESH))
def test_a_drafter_managing_its_own_randomness_is_a_gap_not_lossless(name):
    """The exact check traces each draft's law, not that the draws are fresh: these were `lossless` in
    provenance mode (4 of 4, transformers 5.24.0) while step mode fails each. Control: the built-in
    Assisted, drawing from torch's global stream, stays lossless."""
    from fixtures.mutants import private_randomness

    private_randomness.RestoresRngState.saved = None
    generator = resolve_generator(f"fixtures.mutants.private_randomness:{name}")
    row = run_provenance_case(Case(generator, {"top_k": 3}, "provenance", DEFAULT), seed=0)
    assert row.verdict == "skipped" and NOT_FRESH[name] in row.reason, row.reason
    control = run_provenance_case(Case(resolve_generator("AssistedCandidateGenerator"), {"top_k": 3}, "provenance",
                                       DEFAULT), seed=0)
    assert control.verdict == "lossless", control.reason


@needs(DFLASH)
def test_disagreement_is_loud_only_on_contradiction():
    result = provenance_check(Case(resolve_generator(MUTANT), {"top_k": 3}, scenario=IID), trials=1)
    assert "DISAGREEMENT" in disagreement("lossless", result)
    assert disagreement("not_lossless", result) is None
    assert disagreement("error", result) is None


# Provenance of every built-in generator that returns a q, by release: "inconsistent" within the
# spans, "consistent" outside them; the exact check agrees with the statistical findings of
# tests/test_adapters.py and the compat table (benchmarks/compat_table.md), 4.37.0-5.25.0.
INCONSISTENT = {
    # greedy drafts (do_sample=False) returned with the scores as q
    "AssistedCandidateGenerator": ASSISTED_DRAFTS_GREEDILY,
    "EarlyExitCandidateGenerator": None,
    # the raw logits returned while the processed ones are sampled
    "MTPCandidateGenerator": MTP_RETURNS_RAW_LOGITS,
    "DFlashTokenCandidateGenerator": ("5.15.0", "5.15.1"),
    # Pruned-head logits scattered back in assistant-id order, drafts mapped in get_vocab() order.
    "UniversalSpeculativeDecodingGenerator": ("4.52.1", None),
    # Argmax drafts returned with the raw logits as q.
    "SinglePositionMultiTokenCandidateGenerator": ("5.8.0", None),
}
NEWEST_EXAMINED = "5.25.0"


@pytest.mark.parametrize("generator", sorted(INCONSISTENT))
def test_builtin_generators_provenance(generator):
    from packaging.version import Version

    resolved = resolve_generator(generator)
    if resolved.generator_class is None:
        pytest.skip(f"transformers {INSTALLED} has no {generator}")
    if INSTALLED > Version(NEWEST_EXAMINED):
        pytest.skip(f"transformers {INSTALLED} is newer than the releases examined (to {NEWEST_EXAMINED})")
    if generator == "EarlyExitCandidateGenerator" and within(EARLY_EXIT_OMITS_FIRST_ITERATION):
        pytest.skip("EarlyExit raises at every call here (tests/test_adapters.py asserts it)")
    span = INCONSISTENT[generator]
    case = Case(resolved, {"top_k": 3}, scenario=IID)
    assert provenance_check(case, trials=1).verdict == ("inconsistent" if span and within(span) else "consistent")
