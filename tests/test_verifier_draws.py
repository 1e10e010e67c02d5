"""The installed verifier's draw under :class:`~lossless_check.modes.interception.VerifierDraws`.

At a vocabulary of 1,024 or more, step mode lets the installed ``_speculative_sampling`` make its
residual or bonus draw by inverse CDF instead of ``torch.multinomial`` (``--torch-draws`` turns it off).
What is asserted here:

- **A/B, the same laws.** Seeded: the real verifier's residual law (draft rejected: ``normalize(max(p -
  q, 0))``) and bonus law (every draft accepted: ``p`` at position ``gamma + 1``) at V = 2,048, drawn
  :data:`DRAWS` times under each sampler (torch's kernel, the substitute), each sample tested against the
  exact law by the project's verdict test at :data:`ALPHA`: four tests, so a correct pair of samplers
  fails this test with probability at most ``4 * ALPHA`` = 4e-4 (union bound), whatever the seed. Two laws
  equal to the exact one are equal to each other.
- **A broken substitute fails it**: off by one in the CDF (each token shifted to the next id), and one
  drawing from the squared weights (same support, wrong law; its TV from the residual law is above the
  test's ``tv_detectable``, so it is rejected with probability at least 0.99).
- **Only where it was verified**: a draw from anywhere but the installed verifier's draw line, a bfloat16
  row, a small vocabulary, ``torch_draws``: torch's own kernel, none counted; a verifier whose source has
  no single such line keeps torch's kernel everywhere.
- **Counted**: a step case's JSON row says how many of its draws were substituted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lossless_check.core.compat import installed_verifier, speculative_sampling
from lossless_check.modes import interception
from lossless_check.modes.interception import ONE_ROW_FROM_VOCAB, VerifierDraws, verifier_draw_site
from lossless_check.stats import Stratum
from lossless_check.stats.verdict import verdict_test

V = 2048
GAMMA = 2
#: Draws per law and sampler: the verdict test then detects TV 0.089 on these 12-token laws (power 0.99).
DRAWS = 3000
#: Level of each of the four tests (family false-failure rate 4e-4).
ALPHA = 1e-4
#: Where the target and the drafter put their mass: spread over the vocabulary, its last id included
#: (an off-by-one at the end of the CDF would show there).
SUPPORT = [0, 1, 7, 300, 301, 1023, 1024, 1500, 2000, 2045, 2046, 2047]


def laws() -> tuple[torch.Tensor, torch.Tensor]:
    """``(target logits, drafter logits)``, float32, shape ``(GAMMA + 1, V)`` and ``(GAMMA, V)``: seeded
    values on :data:`SUPPORT`, ``-inf`` elsewhere; the drafter puts its mass on half of the target's tokens."""
    rng = np.random.default_rng(7)
    target = torch.full((GAMMA + 1, V), float("-inf"))
    target[:, SUPPORT] = torch.tensor(rng.normal(size=(GAMMA + 1, len(SUPPORT))), dtype=torch.float32)
    drafter = torch.full((GAMMA, V), float("-inf"))
    drafter[:, SUPPORT[::2]] = torch.tensor(rng.normal(size=(GAMMA, len(SUPPORT[::2]))) + 1.0, dtype=torch.float32)
    return target, drafter


def residual_round() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
    """A round whose first draft the target gives probability 0 (rejected: the emitted token is the
    residual's), and the exact residual law as the verifier computes its weights (float32 softmaxes)."""
    target, drafter = laws()
    outside = next(t for t in range(V) if t not in SUPPORT)
    drafter[0, outside] = 2.0  # the draft: q > 0, p = 0
    candidates = torch.tensor([[3, 1, outside, SUPPORT[0]]])
    weights = (target[0].softmax(-1) - drafter[0].softmax(-1)).clamp(min=0).double()
    return candidates, drafter[None], target[None], (weights / weights.sum()).numpy()


def bonus_round() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
    """A round whose drafts the target gives at least the drafter's probability (all accepted: the emitted
    last token is drawn from the target's law at position ``GAMMA + 1``), and that law."""
    target, drafter = laws()
    drafts = [SUPPORT[2], SUPPORT[4]]
    for j, token in enumerate(drafts):
        target[j, token] = 6.0  # p(draft) near 1 > q(draft)
    candidates = torch.tensor([[3, 1, *drafts]])
    return candidates, drafter[None], target[None], target[GAMMA].softmax(-1).double().numpy()


def emitted(round_, draws: int, seed: int, torch_draws: bool) -> tuple[np.ndarray, int]:
    """Counts of the token the real verifier draws (the residual after a rejection at position 1, or the
    bonus after a full accept: the trials that made that draw), and how many draws were substituted."""
    candidates, candidate_logits, new_logits, _ = round_
    verify = speculative_sampling()
    counts = np.zeros(V, dtype=np.int64)
    torch.manual_seed(seed)
    with VerifierDraws(V, torch_draws) as substitution:
        for _ in range(draws):
            tokens, n = verify(candidates, candidate_logits, GAMMA, new_logits.clone())
            if int(n) in (0, GAMMA):  # a rejection of the p = 0 draft (2^-24 per round accepts it) / a full accept
                counts[int(tokens[0, -1])] += 1
    return counts, substitution.tally.substituted


def rejects(counts: np.ndarray, law: np.ndarray):
    """Whether the draws are not from ``law``: a token outside :data:`SUPPORT` (where every law here lives)
    rejects exactly; else the verdict test at :data:`ALPHA` on the 12 tokens (its ``tv_detectable`` is then
    a figure for 12 tokens, not 2,048)."""
    outside = int(counts.sum() - counts[SUPPORT].sum())
    result = verdict_test([Stratum(counts[SUPPORT], law[SUPPORT])], ALPHA)
    return outside > 0 or result.rejects(ALPHA), result


@pytest.mark.parametrize("make_round", [residual_round, bonus_round], ids=["residual", "bonus"])
def test_the_verifiers_draw_follows_its_law_under_both_samplers(make_round):
    round_ = make_round()
    law = round_[3]
    for torch_draws in (True, False):
        counts, substituted = emitted(round_, DRAWS, seed=1, torch_draws=torch_draws)
        assert counts.sum() >= DRAWS - 1  # at most a 2^-24 event apart
        assert substituted == (0 if torch_draws else DRAWS)  # the A/B really compares two samplers
        rejected, result = rejects(counts, law)
        assert not rejected, (torch_draws, result)


def _shifted(weights: torch.Tensor) -> torch.Tensor:
    """Off by one in the CDF: the token after the one the inverse CDF picks."""
    return (INVERSE_CDF(weights) + 1) % weights.shape[1]


def _squared(weights: torch.Tensor) -> torch.Tensor:
    """The squared weights' law: the same support, another law."""
    return INVERSE_CDF(weights ** 2)


INVERSE_CDF = interception.inverse_cdf_tokens
BROKEN = {"off_by_one": _shifted, "squared_weights": _squared}


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_a_broken_substitute_fails_the_ab_test(breakage, monkeypatch):
    """Off by one: tokens outside the law's support (an exact rejection). Squared weights: its TV from the
    residual law exceeds the test's ``tv_detectable`` at this sample size, so it is rejected with
    probability at least 0.99, whatever the seed."""
    round_ = residual_round()
    law = round_[3]
    monkeypatch.setattr(interception, "inverse_cdf_tokens", BROKEN[breakage])
    counts, substituted = emitted(round_, DRAWS, seed=1, torch_draws=False)
    assert substituted == DRAWS
    rejected, result = rejects(counts, law)
    assert rejected, result
    if breakage == "squared_weights":
        squared = law ** 2 / (law ** 2).sum()
        assert 0.5 * np.abs(squared - law).sum() > result.tv_detectable, result
    else:
        assert counts[SUPPORT].sum() < counts.sum()  # rejected exactly: tokens outside the law's support


# -- where the substitute stands in, and where it does not ---------------------------------------------


def _spy_on_torch(monkeypatch) -> list:
    """Calls reaching torch's own ``multinomial`` (the original the substitution falls back to)."""
    calls = []
    original = torch.multinomial

    def spy(*args, **kwargs):
        calls.append(tuple(args[0].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", spy)
    return calls


def test_only_the_verifiers_draw_line_is_substituted(monkeypatch):
    """A one-row draw at V = 2,048 from anywhere else (a generator's own) keeps torch's kernel; the
    verifier's is substituted and counted."""
    calls = _spy_on_torch(monkeypatch)
    candidates, candidate_logits, new_logits, _ = residual_round()
    with VerifierDraws(V) as draws:
        torch.multinomial(torch.ones(1, V), 1)
        torch.ones(1, V).multinomial(1)  # the method is never patched
        assert calls == [(1, V)] and draws.tally.substituted == 0
        speculative_sampling()(candidates, candidate_logits, GAMMA, new_logits.clone())
        assert calls == [(1, V)] and draws.tally.substituted == 1
    torch.multinomial(torch.ones(1, V), 1)
    assert len(calls) == 2  # restored


def test_half_precision_rows_keep_torchs_kernel(monkeypatch):
    """Torch's kernel on a bfloat16 row has its own bias, which a run on such rows must see: the verifier's
    draw from a bfloat16 ``p_prime`` is torch's, and not counted."""
    calls = _spy_on_torch(monkeypatch)
    candidates, candidate_logits, new_logits, _ = residual_round()
    with VerifierDraws(V) as draws:
        speculative_sampling()(candidates, candidate_logits.bfloat16(), GAMMA, new_logits.bfloat16())
    assert calls == [(1, V)] and draws.tally.substituted == 0


@pytest.mark.parametrize("vocab, torch_draws", [(ONE_ROW_FROM_VOCAB - 1, False), (V, True)],
                         ids=["small_vocabulary", "torch_draws"])
def test_a_small_vocabulary_or_torch_draws_substitutes_nothing(vocab, torch_draws, monkeypatch):
    calls = _spy_on_torch(monkeypatch)
    candidates, candidate_logits, new_logits, _ = residual_round()
    with VerifierDraws(vocab, torch_draws) as draws:
        speculative_sampling()(candidates, candidate_logits, GAMMA, new_logits.clone())
    assert calls == [(1, V)] and draws.tally.substituted == 0


def test_the_draw_site_is_the_one_line_of_the_installed_verifier():
    """Every release from 4.37 to 5.25 draws with ``torch.multinomial(p_prime, num_samples=1)`` on one line;
    a function with two such lines, or none, has no site (torch's kernel everywhere)."""
    import inspect

    code = installed_verifier().__code__
    line = verifier_draw_site(code)
    lines, start = inspect.getsourcelines(code)
    assert line is not None and "torch.multinomial(p_prime, num_samples=1)" in lines[line - start]

    def two_sites(p_prime):
        a = torch.multinomial(p_prime, num_samples=1)
        b = torch.multinomial(p_prime, num_samples=1)
        return a, b

    def none(p_prime):
        return torch.multinomial(p_prime, 1)

    assert verifier_draw_site(two_sites.__code__) is None and verifier_draw_site(none.__code__) is None


def test_a_case_counts_its_substituted_draws():
    """A step case at V = 1,024 (one verifier draw a trial, all of float32 rows) counts every trial's
    draw; with ``torch_draws`` none. The count is in the JSON row."""
    import json

    from lossless_check.evidence.results import Case
    from lossless_check.faces.api import run_cases
    from lossless_check.laws.scenarios import Scenario
    from lossless_check.laws.tables import FixedLogits
    from lossless_check.subjects.adapters import resolve_generator

    rng = np.random.default_rng(0)
    scenario = Scenario("iid1024", FixedLogits.iid(rng.normal(size=ONE_ROW_FROM_VOCAB) * 2),
                        FixedLogits.iid(rng.normal(size=ONE_ROW_FROM_VOCAB) * 2), (3, 1, 4), 2)
    generator = resolve_generator("AssistedCandidateGenerator")
    counted = {}
    for torch_draws in (False, True):
        case = Case(generator, {"top_k": 20}, "step", scenario, torch_draws=torch_draws)
        result = run_cases([case], 200, 1e-6, 0, batch_size=1).cases[0]
        assert result.verdict != "error", result.reason
        counted[torch_draws] = json.loads(json.dumps(result.to_dict()))["substituted_draws"]
        assert result.samples == 200
    assert counted == {False: {"verifier": 200, "batched_drafts": 0}, True: {"verifier": 0, "batched_drafts": 0}}
