"""The betting e-process of ``lossless-check models``: its false-failure rate and its power, on synthetic laws."""

import math

import numpy as np

from lossless_check.modes.models.pair import raw_logits_law
from lossless_check.stats.betting import BettingState, log_factors


def _laws(rng, vocab=200, k=20):
    """A target law and a drafter law nearby, both truncated to their top k (as under top_k)."""
    logits = rng.normal(0, 2, vocab)
    drafter = logits + rng.normal(0, 0.5, vocab)

    def top_k(z):
        keep = z >= np.sort(z)[-k]
        e = np.where(keep, np.exp(z - z.max()), 0.0)
        return e / e.sum(), np.exp(z - z.max()) / np.exp(z - z.max()).sum()

    p, _ = top_k(logits)
    q, q_raw = top_k(drafter)
    return p, q, q_raw


def test_every_bet_has_mean_one_under_the_null():
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q, q_raw = _laws(rng)
        support = np.flatnonzero(p > 0)
        factors = np.exp(log_factors(p, q, support, raw_logits_law(p, q, q_raw)))  # (support, components)
        assert np.allclose(p[support] @ factors, 1.0, atol=1e-12)
        assert (factors >= 0).all()


def test_null_false_failure_rate_is_below_alpha():
    """Tokens drawn from p: the share of streams whose e-value ever reaches 1/alpha stays below alpha (Ville)."""
    rng = np.random.default_rng(1)
    alpha, streams, tokens = 0.1, 300, 100
    laws = [_laws(rng) for _ in range(50)]
    rejected = 0
    for _ in range(streams):
        bet = BettingState.start()
        for t in range(tokens):
            p, q, q_raw = laws[rng.integers(len(laws))]
            bet.update(p, q, raw_logits_law(p, q, q_raw), int(rng.choice(p.size, p=p)), alpha)
        rejected += bet.rejected_at is not None
        assert bet.support_violations == 0
    # Binomial(300, 0.1): P(X > 45) < 0.005; the e-process is conservative, so far fewer reject.
    assert rejected <= 45, rejected


def test_raw_logits_bug_law_is_detected():
    """Tokens drawn from the law a round's first token follows under the raw-logits bug (negative control)."""
    rng = np.random.default_rng(2)
    laws = [_laws(rng) for _ in range(50)]
    bet = BettingState.start()
    tvs = []
    for t in range(3000):
        p, q, q_raw = laws[rng.integers(len(laws))]
        emitted = raw_logits_law(p, q, q_raw)
        tvs.append(0.5 * np.abs(emitted - p).sum())
        # Aimed at p itself: the bet must find the departure through q alone.
        bet.update(p, q, p, int(rng.choice(p.size, p=emitted / emitted.sum())), 1e-6)
        if bet.rejected_at:
            break
    assert bet.rejected_at is not None and bet.support_violations == 0
    assert np.median(tvs) > 0.01


def test_correct_algorithm_emits_the_target_law():
    rng = np.random.default_rng(3)
    p, q, _ = _laws(rng)
    assert np.abs(raw_logits_law(p, q, q) - p).sum() < 1e-12


def test_token_outside_the_support_is_an_exact_failure():
    bet = BettingState.start()
    p = np.array([0.5, 0.5, 0.0])
    bet.update(p, np.array([0.2, 0.2, 0.6]), p, 2, 1e-6)
    assert bet.support_violations == 1 and bet.log_evalue == 0.0 and math.isfinite(bet.max_log_evalue)


def test_top_k_boundary_within_float_rounding_is_ambiguous():
    """A top_k boundary that float rounding between two forward passes can move is flagged (its position is not
    bet on); a clear gap, a k covering the vocabulary, or removed tokens past the boundary are not."""
    import torch

    from lossless_check.modes.models.pair import BOUNDARY_TOLERANCE, top_k_ambiguous

    tolerance = BOUNDARY_TOLERANCE[torch.float32]
    row = torch.tensor([9.0, 8.5, 8.0, 8.0 - 5e-5, 1.0])
    assert top_k_ambiguous(row, 3, tolerance)  # 3rd and 4th within 1e-3 * 8
    assert not top_k_ambiguous(row, 2, tolerance)  # gap 0.5
    assert not top_k_ambiguous(row, 5, tolerance)
    assert not top_k_ambiguous(torch.tensor([2.0, 1.0, -math.inf, -math.inf]), 2, tolerance)
