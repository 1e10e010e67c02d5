"""Step mode end to end: real generators pass, the negative control fails with the claimed power."""

import numpy as np
import pytest
import torch

from lossless_check.subjects.adapters import resolve_generator
from lossless_check.laws.expected import ExactLaws, first_token_law
from lossless_check.faces.api import run_cases as run
from lossless_check.evidence.results import Case
from lossless_check.laws.scenarios import IID
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.laws.warpers import capture_processors
from fixtures.releases import DFLASH, assisted_samples, lossless_builtins, needs

MUTANT = "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits"


def _processors(scenario, warpers):
    target = fixed_logits_lm(scenario.target, len(scenario.prompt))
    processors, _ = capture_processors(target, torch.tensor([scenario.prompt]), warpers, 64)
    return processors


def test_acceptance_law_matches_closed_form_for_iid_tables():
    laws = ExactLaws(IID, _processors(IID, {}))
    p, q = laws.target(), laws.drafter()
    a = np.minimum(p, q).sum()
    expected = [1 - a, a * (1 - a), a * a * (1 - a), a**3]
    assert laws.acceptance_law(3).probabilities == pytest.approx(expected, abs=1e-12)


def test_first_token_law_is_the_target_when_q_is_honest():
    laws = ExactLaws(IID, _processors(IID, {"top_k": 3}))
    p, q = laws.target(), laws.drafter()
    assert first_token_law(p, q, q) == pytest.approx(p, abs=1e-12)


def raw_logits_bug_tv(warpers):
    """Exact TV of the first emitted token when the drafter samples processed q but returns raw q."""
    laws = ExactLaws(IID, _processors(IID, warpers))
    raw = torch.softmax(torch.tensor(IID.drafter.rows[0]), -1).numpy()
    return 0.5 * np.abs(first_token_law(laws.target(), laws.drafter(), raw) - laws.target()).sum()


@pytest.mark.parametrize("generator", lossless_builtins("AssistedCandidateGenerator", DFLASH))
def test_builtin_generators_are_lossless(generator):
    samples = 3000 if generator == DFLASH else 1500
    result = run([Case(resolve_generator(generator), {"top_k": 3}, scenario=IID)], samples, 1e-6, seed=0, sequential=False)
    case = result.cases[0]
    assert case.verdict == "lossless", case.reason
    assert case.expected_acceptance_rate is not None
    assert "acceptance_law" not in case.diagnostics  # the stubs draft from the q the theory assumes


@needs(DFLASH)
def test_raw_logits_mutant_is_flagged_with_the_claimed_power():
    # 8000 trials: the claim for batch-1 calls (the batched rows' 0.055 plus 0.014 the replays leave
    # unproven) is then below the bug's 0.076.
    samples = 8000
    result = run([Case(resolve_generator(MUTANT), {"top_k": 3}, scenario=IID)], samples, 1e-6, seed=0, sequential=False)
    case = result.cases[0]
    true_tv = raw_logits_bug_tv({"top_k": 3})
    # The engine claims detection with power 0.99 above tv_detectable; the bug is above it.
    assert true_tv > case.tv_detectable
    assert case.verdict == "not_lossless"
    assert "output_law@1" in case.failed_checks
    assert case.acceptance_rate > case.expected_acceptance_rate  # inflated p/q ratios
    assert "TV" in case.reason and "acceptance rate" in case.reason


@needs(DFLASH)
def test_mutant_is_honest_without_warpers():
    """With no warper that changes q, raw and processed logits agree: the mutant is then lossless."""
    result = run([Case(resolve_generator(MUTANT), {"top_k": 0}, scenario=IID)], 1500, 1e-6, seed=1, sequential=False)
    assert result.cases[0].verdict == "lossless", result.cases[0].reason


@needs(DFLASH)
def test_same_seed_same_result():
    def once():
        r = run([Case(resolve_generator("DFlashTokenCandidateGenerator"), {"top_k": 3}, scenario=IID)], 300, 1e-6, 5, sequential=False)
        d = r.cases[0].to_dict()
        d.pop("seconds"), d.pop("samples_per_second")
        return d

    assert once() == once()


@assisted_samples()
def test_drafts_that_stop_at_eos_are_tested_not_rejected():
    """An EOS-boosting length penalty makes the assistant stop drafting early, so draft lengths vary
    from round to round, as they do in _assisted_decoding: still lossless, and the token after a
    short draft counts as a sample of p, not of the rejection residual."""
    from lossless_check.modes.step import StepCase

    warpers = {"top_k": 3, "exponential_decay_length_penalty": (1, 2.0), "eos_token_id": 5}
    case = Case(resolve_generator("AssistedCandidateGenerator"), warpers)
    obs = StepCase(case).collect(300, seed=0)
    assert obs.drafts.min() < obs.drafts.max() == 3
    result = run([case], 2000, 1e-6, seed=0, sequential=False).cases[0]
    assert result.verdict == "lossless", result.reason
    assert not result.diagnostics and "varying length" in result.reason


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
def test_impossible_drafts_equal_the_full_softmax_test(dtype, monkeypatch):
    """The shortcut (:func:`~lossless_check.modes.replay.surely_possible`) flags exactly the drafts
    ``softmax(q) == 0`` flags, at every logit scale (underflow), with -inf, +inf and NaN rows; its
    negative control, a shortcut that clears every draft, misses them."""
    from lossless_check.modes import replay

    generator = torch.Generator().manual_seed(0)
    vocab, rows, gamma, prompt = 1000, 64, 4, 3
    ids = torch.cat([torch.zeros(rows, prompt, dtype=torch.long),
                     torch.randint(0, vocab, (rows, gamma), generator=generator)], dim=1)

    def cases():
        for scale in (1, 10, 30, 60, 100, 200):
            logits = (torch.randn(rows, gamma, vocab, generator=generator) * scale).to(dtype)
            logits[0, 1, ids[0, prompt + 1]] = -float("inf")
            logits[1, 0, :] = -float("inf")
            logits[2, 2, 5] = float("inf")
            logits[3, 3, 7] = float("nan")
            full = (torch.softmax(logits, dim=-1).gather(-1, ids[:, prompt:, None])[..., 0] == 0).numpy()
            yield logits, full & (np.arange(gamma) < 3)  # lengths 3: the last draft is outside

    flagged = 0
    for logits, full in cases():
        assert (replay.impossible_drafts(ids, logits, [3] * rows, prompt) == full).all()
        flagged += int(full.sum())
    assert flagged > rows
    monkeypatch.setattr(replay, "surely_possible", lambda logits, tokens: torch.ones(tokens.shape[:-1], dtype=torch.bool))
    assert any((replay.impossible_drafts(ids, logits, [3] * rows, prompt) != full).any() for logits, full in cases())


@pytest.mark.parametrize("scenario", ["markov8", "lm49k"])
def test_history_free_row_caches_give_what_each_prefix_computes(scenario):
    """Under a history-free stack, step mode's target logits put together from kept table rows are
    bitwise the target's forward pass processed at that candidate, and the exact laws kept by row are
    those computed for each prefix; under a history-dependent stack nothing is kept by row."""
    from lossless_check.laws.scenarios import SCENARIOS
    from lossless_check.modes.step import StepCase

    stack = {"top_k": 5, "temperature": 0.8} if scenario == "markov8" else {"top_k": 50}
    case = Case(resolve_generator("AssistedCandidateGenerator"), stack, scenario=SCENARIOS[scenario])
    step = StepCase(case)
    assert step.target_side.by_row is not None
    gen = torch.Generator().manual_seed(0)
    vocab = case.scenario.vocab_size
    for _ in range(12):
        drafts = torch.randint(0, vocab, (1, case.scenario.gamma), generator=gen)
        candidates = torch.cat([step.prompt_ids, drafts], dim=1)
        assert torch.equal(step.target_logits(candidates), step.target_side.computed(candidates))
        fresh = ExactLaws(case.scenario, None)
        fresh.processors, fresh._by_row = step.processors, None
        prefix = tuple(drafts[0, :2].tolist())
        assert np.array_equal(step.laws.target(prefix), fresh.target(prefix))
        assert np.array_equal(step.laws.drafter(prefix), fresh.drafter(prefix))
    dependent = StepCase(Case(resolve_generator("AssistedCandidateGenerator"), {"repetition_penalty": 2.0},
                              scenario=SCENARIOS["markov8"]))
    assert dependent.target_side.by_row is None and dependent.laws._by_row is None
