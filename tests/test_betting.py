"""The betting e-process of ``lossless-check models`` (:mod:`lossless_check.stats.betting`) on synthetic laws.

Every test is seeded (so its outcome is fixed); each states how often it would fail, over seeds, if the code
were right (its false-fail rate), and has a broken control that must fail. The e-process is checked against
:class:`NaiveEValue`, written here from the module docstring's formulas and sharing no code with the library
(numpy only; the Krichevsky-Trofimov bets multiplied token by token, where the library uses the closed form);
:class:`~lossless_check.stats.power.PowerSimulation` against :func:`_brute_force_power`, which builds the
departures its own way (root finding with scipy, no bisection) and bets with :class:`NaiveEValue`.
"""

import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import binom

from lossless_check.modes.models.sampling import raw_logits_law
from lossless_check.stats import betting
from lossless_check.stats.betting import FIXED, BettingState, PositionBets, observe_token
from lossless_check.stats.power import DIRECTIONS, SIZES, PowerCall, PowerSimulation, departures

VOCAB, TOP_K = 40, 12


def _laws(rng, vocab=VOCAB, k=TOP_K, noise=0.5, scale=2.0):
    """A target law and a drafter law nearby, both truncated to the target's top k (as under top_k), the
    drafter's raw law, and ``r`` (the raw-logits bug law)."""
    logits = rng.normal(0, scale, vocab)
    drafter = logits + rng.normal(0, noise, vocab)
    keep = logits >= np.sort(logits)[-k]

    def truncated(z):
        e = np.where(keep, np.exp(z - z.max()), 0.0)
        return e / e.sum()

    p, q = truncated(logits), truncated(drafter)
    q_raw = np.exp(drafter - drafter.max()) / np.exp(drafter - drafter.max()).sum()
    return p, q, raw_logits_law(p, q, q_raw)


class NaiveEValue:
    """The e-value of the module docstring for ``streams`` independent token streams, token by token."""

    EPS = (0.9, 0.5, 0.25, 1 / 8, 1 / 16, 1 / 32, 1 / 64)
    BINS = (2, 4, 8, 16, 32)

    def __init__(self, streams: int, eps=EPS):
        self.eps = np.array(eps)
        self.wealth = {name: np.ones((streams, count * len(eps)))
                       for name, count in (("toward_q", 5), ("sharper", 1), ("flatter", 1))}
        self.kt = {order: [np.ones(streams) for _ in self.BINS] for order in ("p", "q/p")}
        self.counts = {order: [np.zeros((streams, b)) for b in self.BINS] for order in ("p", "q/p")}
        self.seen = 0

    def add(self, p, q, r, tokens, v):
        """One position's tokens (one per stream) with null ``p``, aiming laws ``q``, ``r``, PIT uniforms ``v``."""
        tokens, v = np.asarray(tokens), np.asarray(v)
        inside = p > 0
        ratio = np.divide(q, p, out=np.zeros_like(p), where=inside)
        centred = []
        for w in ((q > p).astype(float), np.minimum(ratio, 2.0), np.minimum(ratio, 8.0), ratio,
                  np.divide(r, p, out=np.zeros_like(p), where=inside)):
            mean = float(np.sum(p * w))
            centred.append((w[tokens] - mean) / mean if mean > 0 else np.zeros(tokens.size))
        square, top = float(np.sum(p * p)), float(p.max())
        sharper = (p[tokens] - square) / square
        flatter = (square - p[tokens]) / (top - square) if top > square else np.zeros(tokens.size)
        for name, rows in (("toward_q", centred), ("sharper", [sharper]), ("flatter", [flatter])):
            g = np.array(rows).T  # (streams, statistics)
            self.wealth[name] *= (1.0 + g[:, :, None] * self.eps).reshape(tokens.size, -1)
        support = [y for y in range(len(p)) if inside[y]]
        for order, key in (("p", lambda y: (-p[y], y)), ("q/p", lambda y: (-ratio[y], y))):
            before = np.zeros_like(p)
            mass = 0.0
            for y in sorted(support, key=key):
                before[y] = mass
                mass += p[y]
            u = before[tokens] + v * p[tokens]
            for i, b in enumerate(self.BINS):
                bins = np.minimum((u * b).astype(int), b - 1)
                counts = self.counts[order][i]
                rows = np.arange(tokens.size)
                self.kt[order][i] *= b * (counts[rows, bins] + 0.5) / (self.seen + b / 2)
                counts[rows, bins] += 1
        self.seen += 1

    def log_evalue(self) -> np.ndarray:
        families = [w.mean(axis=1) for w in self.wealth.values()] + [np.mean(kt, axis=0) for kt in self.kt.values()]
        return np.log(np.mean(families, axis=0))


def test_every_bet_has_mean_one_and_the_pit_is_uniform_under_the_null():
    """Exact identities (no randomness; float64 rounding only, 1e-12): under ``p`` every statistic bet's factor
    has mean 1 and is positive, and ``P(U <= u) = u`` for both PIT orders. Control: the same bets under another
    law (``q``) have means away from 1, and the PIT is then not uniform."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        p, q, r = _laws(rng)
        bets = PositionBets(p, q, r)
        support = np.arange(bets.support.size)
        factors = np.exp(bets.observe(support, np.full(support.size, 0.5))[:, :FIXED])
        assert (factors > 0).all()
        assert np.abs(bets.p @ factors - 1.0).max() < 1e-12
        wrong = q[bets.support] / q[bets.support].sum()
        assert np.abs(wrong @ factors - 1.0).max() > 1e-3  # control
        for u in rng.random(5):
            for starts in bets.starts:
                # P(U <= u) = sum_x p(x) P(start_x + V p(x) <= u), V uniform.
                assert abs(bets.p @ np.clip((u - starts) / bets.p, 0, 1) - u) < 1e-12
        # Control: the PIT of tokens drawn from q is not uniform at some u.
        assert max(abs(wrong @ np.clip((u - bets.starts[0]) / bets.p, 0, 1) - u) for u in (0.25, 0.5, 0.75)) > 1e-3


def test_the_library_e_value_is_the_naive_one_token_by_token():
    """:class:`BettingState` against :class:`NaiveEValue` on 300 tokens (half from ``p``, half at TV 0.3 in
    reversed rank, so the e-value moves): equal to 1e-9 in log at every token (float64 rounding; no false failure).
    Control: a library with other bet sizes (EPSILONS patched) departs from the naive value."""
    rng = np.random.default_rng(1)
    laws = [_laws(rng) for _ in range(30)]
    stream = []
    for t in range(300):
        p, q, r = laws[rng.integers(len(laws))]
        support = np.flatnonzero(p > 0)
        law = p[support] if t < 150 else departures(p, q, rng)[DIRECTIONS.index("reversed_rank"), SIZES.index(0.3)]
        token = int(support[rng.choice(support.size, p=law / law.sum())])
        stream.append((p, q, r, token, float(rng.random())))

    def library_trajectory():
        bet = BettingState.start()
        values = []
        for p, q, r, token, v in stream:
            bet.update(p, q, r, token, v, alpha=1e-300)
            values.append(bet.log_evalue)
        return np.array(values)

    naive = NaiveEValue(1)
    expected = []
    for p, q, r, token, v in stream:
        naive.add(p, q, r, [token], [v])
        expected.append(float(naive.log_evalue()[0]))
    expected = np.array(expected)
    assert expected[-1] > 5.0  # the sharper half moves it: the comparison is not between two flat lines
    assert np.abs(library_trajectory() - expected).max() < 1e-9
    patched = betting.EPSILONS
    try:
        betting.EPSILONS = tuple(e / 2 for e in patched)
        assert np.abs(library_trajectory() - expected).max() > 1e-3  # control
    finally:
        betting.EPSILONS = patched


def _rejections(laws, law_of, streams, tokens, alpha, rng):
    """How many of ``streams`` token streams (each position's law from ``law_of(p, q)``) reach 1/alpha."""
    state = betting.EProcess((streams,))
    rejected = np.zeros(streams, dtype=bool)
    for _ in range(tokens):
        p, q, r = laws[rng.integers(len(laws))]
        bets = PositionBets(p, q, r)
        law = law_of(p, q)
        index = rng.choice(bets.p.size, streams, p=law / law.sum())
        observed = bets.observe(index, rng.random(streams))
        state.add(observed[:, :FIXED], observed[:, None, FIXED:])
        rejected |= state.log_evalue() >= math.log(1 / alpha)
    return int(rejected.sum())


def test_null_streams_reject_at_most_alpha_of_the_time():
    """Tokens drawn from ``p``: 400 streams of 200 tokens at alpha 0.1. Each rejects with probability at most
    0.1 (Ville), so the count exceeds the Binomial(400, 0.1) quantile 1 - 1e-4 with probability at most 1e-4
    (this test's false-fail rate). Control: streams at per-position TV 0.1 (sharper) exceed it."""
    rng = np.random.default_rng(2)
    laws = [_laws(rng) for _ in range(50)]
    streams, alpha = 400, 0.1
    bound = int(binom.ppf(1 - 1e-4, streams, alpha))
    null = _rejections(laws, lambda p, q: p[p > 0], streams, 200, alpha, rng)
    assert null <= bound, (null, bound)
    sharper = DIRECTIONS.index("sharper"), SIZES.index(0.1)
    assert _rejections(laws, lambda p, q: departures(p, q, rng)[sharper], streams, 200, alpha, rng) > bound


def _tv(a, b):
    return 0.5 * float(np.abs(a - b).sum())


def _independent_departure(p, q, direction, size, rng):
    """The departure of ``direction`` at TV ``size`` from ``p``, built without the library: root finding with
    scipy on the tilt (temperature, or ``q/p``) or the mixture weight; ``None`` where it cannot reach ``size``."""
    support = p > 0
    ps = p[support]

    def tilt(z, b):
        e = ps * np.exp(b * (z - z.max()))
        return e / e.sum()

    if direction in ("toward_q", "away_from_q", "sharper", "flatter"):
        z = {"toward_q": np.log(q[support] / ps), "away_from_q": -np.log(q[support] / ps)}.get(direction, np.log(ps))
        low, high = (-1.0, 0.0) if direction == "flatter" else (0.0, 63.0)
        end = low if direction == "flatter" else high
        if _tv(tilt(z, end), ps) < size:
            return None
        b = brentq(lambda b: _tv(tilt(z, b), ps) - size, low, high, xtol=1e-12)
        law = tilt(z, b)
    else:
        order = np.argsort(-ps, kind="stable")
        other = np.empty_like(ps)
        other[order] = ps[order][::-1] if direction == "reversed_rank" else ps[order][rng.permutation(ps.size)]
        weight = size / _tv(other, ps)
        law = ps + weight * (other - ps)
        if law.min() < 0:
            return None
    out = np.zeros_like(p)
    out[support] = law
    return out


def test_departures_have_their_size_and_direction():
    """Each of :func:`departures`' laws is a law on the support of ``p``, at its size (1e-3: the bisection's
    precision) wherever :func:`_independent_departure` reaches it, and equal to it there (1e-3 in TV; a
    ``permuted`` law is random, so only its size is checked). Deterministic: no false failure. Control: the
    sharper law is not the flatter one."""
    rng = np.random.default_rng(3)
    compared = 0
    for _ in range(30):
        p, q, _ = _laws(rng)
        laws = departures(p, q, rng)
        assert np.allclose(laws.sum(axis=-1), 1.0) and (laws >= 0).all()
        for i, direction in enumerate(DIRECTIONS):
            for j, size in enumerate(SIZES):
                mine = np.zeros_like(p)
                mine[p > 0] = laws[i, j]
                theirs = _independent_departure(p, q, direction, size, rng)
                # A permutation is random: its own reach differs from the independent one's.
                if theirs is None or direction == "permuted":
                    assert _tv(mine, p) <= size + 1e-3
                    continue
                compared += 1
                assert abs(_tv(mine, p) - size) < 1e-3, (direction, size)
                assert _tv(mine, theirs) < 1e-3, (direction, size)
        sharper, flatter = laws[DIRECTIONS.index("sharper"), 2], laws[DIRECTIONS.index("flatter"), 2]
        assert _tv(sharper, flatter) > 0.1  # control
    assert compared > 0.8 * 30 * (len(DIRECTIONS) - 1) * len(SIZES)


def _brute_force_power(laws, sequence, direction, size, tokens, alpha, replicates, rng):
    """The share of ``replicates`` streams, each emitting at position ``t`` a token from
    :func:`_independent_departure` of ``laws[sequence[t]]``, whose :class:`NaiveEValue` reaches 1/alpha within
    ``tokens`` (looked at after every token)."""
    naive = NaiveEValue(replicates)
    rejected = np.zeros(replicates, dtype=bool)
    for t in range(tokens):
        p, q, r = laws[sequence[t]]
        law = _independent_departure(p, q, direction, size, rng)
        assert law is not None, (direction, size)  # the laws are chosen so every size is reachable
        tokens_drawn = rng.choice(p.size, replicates, p=law)
        naive.add(p, q, r, tokens_drawn, rng.random(replicates))
        rejected |= naive.log_evalue() >= math.log(1 / alpha)
    return float(rejected.mean())


@pytest.mark.heavy
def test_power_simulation_agrees_with_a_brute_force_simulation():
    """:class:`PowerSimulation` (400 replicates, one position per look) against :func:`_brute_force_power`
    (400 replicates) on the same laws: 150 tokens at alpha 0.01, TV 0.15, every direction (power between 0.05
    and 0.95 there). Each pair of estimates is compared with a two-proportion z-test at |z| < 4 (false-fail
    rate 6e-5 each, 4e-4 for the six). Control: the brute force at TV 0.1 differs from the simulation at TV 0.15
    (|z| > 4) in at least half the directions."""
    rng = np.random.default_rng(4)
    # Laws where every direction reaches TV 0.15 (so both simulations depart by exactly the size).
    laws = [law for law in (_laws(rng, scale=1.5) for _ in range(100))
            if all(_independent_departure(*law[:2], d, 0.15, rng) is not None for d in DIRECTIONS)][:30]
    assert len(laws) == 30
    tokens, alpha, replicates = 150, 0.01, 400
    sequence = rng.integers(len(laws), size=tokens)
    simulation = PowerSimulation(alpha, replicates=replicates)
    for t in range(tokens):
        call = PowerCall(replicates=replicates)
        p, q, r = laws[sequence[t]]
        call.add(p, q, r, rng)
        simulation.add(call)
    power = simulation.power()[:, SIZES.index(0.15)]

    def z(a, b):
        pooled = (a + b) / 2
        return (a - b) / math.sqrt(max(pooled * (1 - pooled), 1e-9) * 2 / replicates)

    far = 0
    for i, direction in enumerate(DIRECTIONS):
        assert 0.05 < power[i] < 0.95, (direction, power[i])
        brute = _brute_force_power(laws, sequence, direction, 0.15, tokens, alpha, replicates, rng)
        assert abs(z(power[i], brute)) < 4, (direction, power[i], brute)
        weaker = _brute_force_power(laws, sequence, direction, 0.1, tokens, alpha, replicates, rng)
        far += abs(z(power[i], weaker)) > 4
    assert far >= len(DIRECTIONS) / 2  # control


def test_default_budget_catches_tv_0_15_in_every_direction():
    """The stated power: 2,048 tokens (the default 64 calls of 32), alpha 5e-7 (the default 1e-6 over two
    rows), laws of a top_k=12 stack: a departure of per-position TV 0.15 in every direction is caught by all 100
    replicates (power >= 0.99 needs at most one miss; a claim that held at power 0.99 would show 100 of 100 with
    probability 0.37, so this assertion holds only because the power is well above it). Control: TV 0.05 is
    not caught with power 0.99 in every direction."""
    rng = np.random.default_rng(5)
    laws = [_laws(rng) for _ in range(50)]
    simulation = PowerSimulation(5e-7)
    for _ in range(64):
        call = PowerCall()
        for _ in range(32):
            p, q, r = laws[rng.integers(len(laws))]
            call.add(p, q, r, rng)
        simulation.add(call)
    assert simulation.detectable_tv() is not None and simulation.detectable_tv() <= 0.15
    assert (simulation.power()[:, SIZES.index(0.05)] < 0.99).any()  # control


def test_tokens_needed_estimate_reaches_the_power():
    """:meth:`PowerSimulation.tokens_needed` after 128 tokens (alpha 0.01, TV 0.15: power below 0.99 in some
    direction) estimates N; a fresh simulation of N tokens then has power >= 0.9 in every direction (the estimate
    is "about": a normal extrapolation; 100 replicates put 0.99 power's estimate above 0.9 with probability
    > 0.999). Control: at N / 4 tokens the power is below 0.99 in some direction."""
    rng = np.random.default_rng(6)
    laws = [_laws(rng) for _ in range(50)]

    def simulate(tokens):
        simulation = PowerSimulation(0.01)
        for _ in range(0, tokens, 32):
            call = PowerCall()
            for _ in range(32):
                p, q, r = laws[rng.integers(len(laws))]
                call.add(p, q, r, rng)
            simulation.add(call)
        return simulation

    first = simulate(128)
    column = SIZES.index(0.15)
    assert (first.power()[:, column] < 0.99).any()
    needed = first.tokens_needed(0.15)
    assert needed is not None and needed > 128
    assert (simulate(math.ceil(needed / 32) * 32).power()[:, column] >= 0.9).all()
    assert (simulate(max(32, needed // 4 // 32 * 32)).power()[:, column] < 0.99).any()  # control


def test_raw_logits_bug_law_is_detected():
    """Tokens from the law a round's first token follows under the raw-logits bug (the negative control of the
    toward-q bets; top_k=6 of 40 tokens, drafter noise 1.0: per-position TV median 0.12), bets aimed at ``p``
    (so through q alone): rejected at alpha 1e-6 within 3,000 tokens; the same stream from ``p`` is not (a
    false failure there has probability at most 1e-6)."""
    rng = np.random.default_rng(7)
    laws = [_laws(rng, k=6, noise=1.0) for _ in range(50)]
    for from_bug in (True, False):
        bet = BettingState.start()
        for _ in range(3000):
            p, q, r = laws[rng.integers(len(laws))]
            law = r if from_bug else p
            bet.update(p, q, p, int(rng.choice(p.size, p=law / law.sum())), float(rng.random()), 1e-6)
            if bet.rejected_at:
                break
        assert (bet.rejected_at is not None) == from_bug and bet.support_violations == 0


def test_correct_algorithm_emits_the_target_law():
    p, q, _ = _laws(np.random.default_rng(8))
    assert np.abs(raw_logits_law(p, q, q) - p).sum() < 1e-12
    assert np.abs(raw_logits_law(p, q, np.full_like(q, 1 / q.size)) - p).sum() > 1e-3  # control


def test_token_outside_the_support_is_an_exact_failure():
    """Exact (no randomness). Control: a token inside the support is bet on."""
    p, q = np.array([0.7, 0.3, 0.0]), np.array([0.2, 0.2, 0.6])
    assert observe_token(p, q, p, 2, 0.5) is None
    bet = BettingState.start()
    bet.update(p, q, p, 2, 0.5, 1e-6)
    assert bet.support_violations == 1 and bet.log_evalue == 0.0 and bet.rejected_at is None
    bet.update(p, q, p, 1, 0.5, 1e-6)  # control
    assert bet.support_violations == 1 and bet.tokens == 2 and bet.log_evalue != 0.0
