"""Batched drafting: one real ``get_candidates`` call on ``B`` identical rows, a fresh generator per call.

For every family flagged ``batchable`` on the installed release, a ``B``-row call must give ``B``
independent first-round drafts, each row what a batch-1 call drafting the same tokens returns:

- every draft token is the token the sampler drew for its row (``torch.multinomial`` is recorded
  while the real call runs), and rows with the same history were drawn from the same law and
  return the same logits;
- replaying a row at batch 1 (the sampler forced to that row's tokens) returns the same
  ``candidate_ids``, bitwise the same ``candidate_logits``, and drew each token from bitwise the
  same probabilities as the batch did; a row of a family whose drafts stop at EOS is compared after
  its cut at its first EOS draft token.

Whether those probabilities are ``softmax(candidate_logits)`` (losslessness) is provenance mode's
question, not batching's: a generator that samples one law and returns another must do the same at
batch ``B`` as at batch 1 (MTP of 5.14.1 does), and does here.

The harness does not rest on these tests: every batched case replays rows of its own calls at batch
1 on the install being checked (``lossless_check/modes/replay.py``, ``tests/test_batch_1_guarantee.py``).
They pin the stronger, bitwise property of each family on each release.

Every session call must build a fresh generator (the first drafting round of ``_assisted_decoding``),
never reuse one. Everything is checked on whatever release is installed (the tests run unchanged in
the virtual environments of older releases).
"""

from __future__ import annotations

import functools

import pytest
import torch

from fixtures.releases import assisted_samples, lossless_builtins
from lossless_check.subjects.adapters import ADAPTERS, DraftContext, FactoryAdapter, resolve_generator
from lossless_check.subjects.adapters.base import installed_release
from lossless_check.modes.replay import SamplerLog
from lossless_check.laws.scenarios import DEFAULT, IID
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.laws.warpers import capture_processors

RELEASE = installed_release()
BATCH = 64
#: Families whose drafts are sampled (``torch.multinomial``); SinglePosition drafts argmaxes.
SAMPLING = ("AssistedCandidateGenerator", "EarlyExitCandidateGenerator", "DFlashTokenCandidateGenerator",
            "MTPCandidateGenerator")
BATCHED = SAMPLING + ("SinglePositionMultiTokenCandidateGenerator",)
EOS = 5
STACKS = (
    {},
    {"top_k": 3},
    {"repetition_penalty": 2.0},
    {"min_new_tokens": 2, "eos_token_id": EOS},
    # EOS grows likelier with length: drafts that stop at EOS (at batch 1) are common.
    {"exponential_decay_length_penalty": (1, 2.0), "eos_token_id": EOS, "top_k": 4},
)


def context(name: str, scenario=IID, warpers=None, generator_class=None) -> DraftContext:
    """The context a case of ``name`` gets: stubs, and the processors ``generate()`` builds."""
    prompt = torch.tensor([scenario.prompt], dtype=torch.long)
    target = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
    processors, config = capture_processors(target, prompt, warpers or {}, 64)
    cls = generator_class or resolve_generator(name).generator_class
    return DraftContext(scenario, cls, config, processors, target, prompt)


def runnable(name: str) -> None:
    """Skip ``name`` where the installed release lacks it, or where it cannot run at all."""
    if ADAPTERS[name].installed_class() is None:
        pytest.skip(f"{name} is not in transformers {RELEASE}")
    if name == "EarlyExitCandidateGenerator" and RELEASE < (5, 3):
        pytest.skip("EarlyExitCandidateGenerator of 5.0-5.2 cannot run (its base needs is_first_iteration)")


def eos_ids(ctx: DraftContext) -> set[int]:
    eos = ctx.generation_config.eos_token_id
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def draft_lengths(adapter, ctx, candidate_ids) -> list[int]:
    """Each row's draft length: all drafts, or, for a family whose drafts stop at EOS, up to its first EOS."""
    length = ctx.prompt_ids.shape[1]
    drafts = candidate_ids[:, length:].tolist()
    eos = eos_ids(ctx)
    if not (adapter.drafts_stop_at_eos and eos):
        return [len(row) for row in drafts]
    return [next((i + 1 for i, t in enumerate(row) if t in eos), len(row)) for row in drafts]


def replay_rows(lengths, candidate_ids, prompt_length, limit=6) -> list[int]:
    """Up to ``limit`` rows with distinct cut drafts, the shortest drafts first (EOS cuts included)."""
    chosen, seen = [], set()
    for r in sorted(range(len(lengths)), key=lambda r: (lengths[r], r)):
        key = tuple(candidate_ids[r, : prompt_length + lengths[r]].tolist())
        if key not in seen:
            seen.add(key)
            chosen.append(r)
    return chosen[:limit]


def check_batch_rows(name, scenario, warpers, batch=BATCH, seed=0, adapter=None, replays=6):
    """The checks of the module docstring for one case; returns the rows' draft lengths."""
    adapter = adapter or ADAPTERS[name]
    ctx = context(name, scenario, warpers)
    session = adapter.session(ctx)
    prompt, length, vocab, gamma = ctx.prompt_ids, ctx.prompt_ids.shape[1], scenario.vocab_size, scenario.gamma
    with torch.no_grad():  # every case here runs at batch 1 (a generator that raises is a finding, not a skip)
        session.draft(prompt)
    torch.manual_seed(seed)
    with torch.no_grad(), SamplerLog(vocab) as draws:
        ids, logits = session.draft(prompt.repeat(batch, 1))
    drafted = ids.shape[1] - length
    assert ids.shape[0] == batch and 1 <= drafted <= gamma, ids.shape
    assert logits is not None and tuple(logits.shape) == (batch, drafted, vocab), logits.shape
    assert torch.equal(ids[:, :length], prompt.expand(batch, -1))
    lengths = draft_lengths(adapter, ctx, ids)
    if not adapter.drafts_stop_at_eos:
        assert drafted == gamma

    if name in SAMPLING:
        assert len(draws.calls) >= max(lengths), (len(draws.calls), lengths)
        for j in range(max(lengths)):
            probs, tokens = draws.calls[j]
            running = [r for r in range(batch) if lengths[r] > j]
            assert probs.shape == (batch, vocab)
            # Each draft token is the one drawn for its row at its position.
            assert torch.equal(tokens[running, 0], ids[running, length + j])
            # Rows with the same history were drawn from the same law and return the same logits
            # (the stubs and processors are deterministic functions of the history).
            first_of = {}
            for r in running:
                first = first_of.setdefault(tuple(ids[r, length : length + j].tolist()), r)
                assert torch.equal(probs[r], probs[first]) and torch.equal(logits[r, j], logits[first, j]), (r, j)
    else:
        # Drafted by argmax: no sampler runs, and every row drafts the same tokens.
        assert not draws.calls
        assert torch.equal(ids, ids[:1].expand_as(ids)) and torch.equal(logits, logits[:1].expand_as(logits))

    # A batch-1 call drafting a row's tokens returns that row (cut at its first EOS), bitwise, and
    # drew each of them from the law the batch drew that row's token from.
    q_is_sampled_law = True
    for r in replay_rows(lengths, ids, length, replays):
        n = lengths[r]
        force = ids[r, length : length + n].tolist() if name in SAMPLING else None
        with torch.no_grad(), SamplerLog(vocab, force) as replayed:
            ids1, logits1 = session.draft(prompt)
        assert torch.equal(ids1[0], ids[r, : length + n]), (ids1, ids[r], n)
        assert torch.equal(logits1[0], logits[r, :n])
        if force is not None:
            assert len(replayed.calls) == n
            for j, (probs1, _) in enumerate(replayed.calls):
                assert torch.equal(probs1[0], draws.calls[j][0][r]), (r, j)
                q_is_sampled_law &= bool(torch.allclose(probs1[0], torch.softmax(logits1[0, j].float(), -1).double(), atol=1e-6))
    if name in SAMPLING and q_is_sampled_law:
        # Where batch-1 calls draw from softmax(returned logits), every row of the batch does.
        for j in range(max(lengths)):
            running = [r for r in range(batch) if lengths[r] > j]
            q = torch.softmax(logits[running, j].float(), dim=-1).double()
            torch.testing.assert_close(draws.calls[j][0][running], q, rtol=0, atol=1e-6)
    return lengths


# --- flags ------------------------------------------------------------------------------------


def test_flags_of_the_built_in_families():
    stop_at_eos = {"AssistedCandidateGenerator", "EarlyExitCandidateGenerator", "UniversalSpeculativeDecodingGenerator",
                   "AssistedCandidateGeneratorDifferentTokenizers"}
    for name, adapter in ADAPTERS.items():
        assert isinstance(adapter.batchable, bool) and isinstance(adapter.drafts_stop_at_eos, bool), name
        if name in stop_at_eos:
            assert adapter.drafts_stop_at_eos, name
    for name in ("UniversalSpeculativeDecodingGenerator", "AssistedCandidateGeneratorDifferentTokenizers",
                 "PromptLookupCandidateGenerator"):
        assert not ADAPTERS[name].batchable, name
    assert ADAPTERS["AssistedCandidateGenerator"].batchable
    assert ADAPTERS["SinglePositionMultiTokenCandidateGenerator"].batchable
    # Block drafters draft their whole block, except the releases that crop it at row 0's EOS.
    row_0_eos = (5, 16) <= RELEASE <= (5, 17)
    for name in ("DFlashTokenCandidateGenerator", "MTPCandidateGenerator"):
        assert ADAPTERS[name].batchable is not row_0_eos and ADAPTERS[name].drafts_stop_at_eos is row_0_eos
    assert not FactoryAdapter(lambda ctx: None).batchable


def test_a_subclass_of_a_built_in_generator_gets_its_family_flags():
    runnable("AssistedCandidateGenerator")
    resolved = resolve_generator(f"{__name__}:MyAssisted")
    assert resolved.adapter is ADAPTERS["AssistedCandidateGenerator"] and resolved.adapter.batchable


def __getattr__(attr):
    if attr == "MyAssisted":  # a user's subclass (built on first use: the class may be missing here)
        return type("MyAssisted", (ADAPTERS["AssistedCandidateGenerator"].installed_class(),), {})
    raise AttributeError(attr)


# --- batch rows are batch-1 calls -------------------------------------------------------------


@pytest.mark.parametrize("warpers", STACKS, ids=lambda w: ",".join(f"{k}={v}" for k, v in w.items()) or "none")
@pytest.mark.parametrize("scenario", (DEFAULT, IID), ids=lambda s: s.name)
@pytest.mark.parametrize("name", lossless_builtins(*BATCHED))
def test_batch_rows_are_what_batch_1_calls_drafting_the_same_tokens_return(name, scenario, warpers):
    runnable(name)
    if not ADAPTERS[name].batchable:
        pytest.skip(f"{name} is not batchable on {RELEASE}")
    check_batch_rows(name, scenario, warpers)


def test_rows_cut_at_eos_are_exercised():
    """The EOS stack really makes assistant drafts stop early (else the cut is never checked)."""
    runnable("AssistedCandidateGenerator")
    lengths = check_batch_rows("AssistedCandidateGenerator", IID, STACKS[-1])
    assert min(lengths) < IID.gamma < max(lengths) + 1


BROKEN_BATCHES = {
    # Row r hands back row r - 1's draft and logits: not what was drawn for row r.
    "rows_rolled": lambda ids, logits: (ids.roll(1, dims=0), logits.roll(1, dims=0)),
    # Every row hands back row 0: one draft for the whole batch.
    "row_0_repeated": lambda ids, logits: (ids[:1].expand_as(ids).clone(), logits[:1].expand_as(logits).clone()),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN_BATCHES))
def test_the_check_fails_for_a_batch_whose_rows_are_not_batch_1_calls(breakage):
    """Negative controls: batches whose rows are not independent batch-1 calls are caught."""
    runnable("DFlashTokenCandidateGenerator")
    from lossless_check.subjects.adapters.dflash import DFlashAdapter

    class BrokenBatch(DFlashAdapter):
        def session(self, ctx):
            inner = super().session(ctx)
            return type(inner)(lambda input_ids: BROKEN_BATCHES[breakage](*inner.draft(input_ids)))

    if not ADAPTERS["DFlashTokenCandidateGenerator"].batchable:
        pytest.skip(f"DFlashTokenCandidateGenerator is not batchable on {RELEASE}")
    with pytest.raises(AssertionError):
        check_batch_rows("DFlashTokenCandidateGenerator", IID, {"repetition_penalty": 2.0}, adapter=BrokenBatch())


# --- a fresh generator per call -----------------------------------------------------------------


def spying(cls):
    """A subclass of ``cls`` recording, for every ``get_candidates`` call, the generator called."""
    calls = []

    class Spy(cls):
        @functools.wraps(cls.get_candidates)
        def get_candidates(self, *args, **kwargs):
            calls.append(self)
            return super().get_candidates(*args, **kwargs)

    return Spy, calls


@pytest.mark.parametrize("name", [pytest.param(n, marks=assisted_samples()) if n == "AssistedCandidateGenerator" else n
                                  for n in sorted(ADAPTERS)])
def test_every_call_is_one_get_candidates_call_of_a_fresh_generator(name):
    runnable(name)
    adapter = ADAPTERS[name]
    spy, calls = spying(adapter.installed_class())
    ctx = context(name, IID, {"top_k": 3}, generator_class=spy)
    session = adapter.session(ctx)
    batch = BATCH if adapter.batchable else 1
    prompt = ctx.prompt_ids.repeat(batch, 1)
    results = []
    with torch.no_grad():
        for call in range(5):
            torch.manual_seed(call % 2)  # calls 0, 2, 4 and calls 1, 3 share a seed
            results.append(session.draft(prompt))
    assert len(calls) == 5 and len({id(g) for g in calls}) == 5  # five generators, one call each
    # Nothing carries over from one call to the next: the same seed drafts the same.
    for a, b in ((0, 2), (2, 4), (1, 3)):
        assert torch.equal(results[a][0], results[b][0])
        assert (results[a][1] is None) == (results[b][1] is None)
        if results[a][1] is not None:
            assert torch.equal(results[a][1], results[b][1])
    if name in SAMPLING and adapter.batchable:
        # Sampled drafts: rows differ from each other, and so do calls with other seeds.
        assert len({tuple(row) for row in results[0][0].tolist()}) > 1
        assert not torch.equal(results[0][0], results[1][0])


@pytest.mark.skipif(not (5, 16) <= RELEASE <= (5, 17), reason="only 5.16-5.17 crop a block at row 0's EOS")
@pytest.mark.parametrize("name", ("DFlashTokenCandidateGenerator", "MTPCandidateGenerator"))
def test_5_16_block_drafters_cut_every_row_at_row_0s_eos_so_they_do_not_batch(name):
    ctx = context(name, IID, STACKS[-1])
    session = ADAPTERS[name].session(ctx)
    length = ctx.prompt_ids.shape[1]
    torch.manual_seed(0)
    with torch.no_grad():
        for _ in range(30):
            drafts = session.draft(ctx.prompt_ids.repeat(BATCH, 1))[0][:, length:]
            if drafts.shape[1] < IID.gamma:
                assert drafts[0, -1] == EOS  # row 0 drew EOS there ...
                assert (drafts[:, -1] != EOS).any()  # ... and rows that did not are cut with it
                return
    pytest.fail("no draft ended at EOS in 30 calls")


def _draws_pvalue(sample, weights: "torch.Tensor", n: int) -> float:
    """The verdict test's p-value (finite-sample valid: ``P(p <= a) <= a`` at every ``n``) of ``n`` draws a row by
    ``sample(weights) -> (rows, 1)`` against ``weights / sum``, one stratum a row; a draw of zero weight
    fails at once."""
    import numpy as np

    from lossless_check.stats import Stratum
    from lossless_check.stats.verdict import verdict_test

    counts = np.zeros(tuple(weights.shape), dtype=np.int64)
    for _ in range(n):
        tokens = sample(weights)[:, 0].numpy()
        counts[np.arange(len(tokens)), tokens] += 1
    law = (weights / weights.sum(-1, keepdim=True)).double().numpy()
    assert counts[law == 0].sum() == 0
    return verdict_test([Stratum(c, p) for c, p in zip(counts, law)], 1e-6).pvalue


def test_a_batched_calls_draws_by_inverse_cdf_come_from_the_weights_law():
    """The law ``torch.multinomial`` samples, one token a row, zero weights never drawn (chi-square over
    3 rows x 2,000 draws, seeded; the verdict test, false failure 1e-6). Control: the same test rejects
    draws from the squared weights (the test can fail)."""
    from lossless_check.modes.interception import inverse_cdf_multinomial

    torch.manual_seed(0)
    weights = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0], [1.0, 2.0, 3.0, 4.0, 0.0], [0.0, 0.0, 0.0, 7.0, 1e-3]])
    sample = inverse_cdf_multinomial(torch.multinomial)
    assert _draws_pvalue(lambda w: sample(w, 1), weights, 2000) > 1e-6
    assert _draws_pvalue(lambda w: sample(w ** 2, 1), weights, 2000) < 1e-6


def test_anything_but_one_token_a_row_of_valid_weights_goes_to_torch():
    """Several tokens, one row, a private generator, half precision and invalid weights call torch's own
    ``multinomial``, which draws or raises as it would."""
    from lossless_check.modes.interception import inverse_cdf_multinomial

    calls = []

    def original(*args, **kwargs):
        calls.append((args, kwargs))
        return torch.multinomial(*args, **kwargs)

    sample = inverse_cdf_multinomial(original)
    weights = torch.ones(4, 6)
    sample(weights, 1)
    sample(weights, num_samples=1, replacement=True)
    assert calls == []
    sample(weights, 2)
    sample(weights[0], 1)
    sample(weights, 1, generator=torch.Generator().manual_seed(0))
    sample(weights.bfloat16(), 1)  # half precision: torch's kernel has its own law there, which runs must see
    sample(weights.half(), 1)
    assert len(calls) == 5
    for bad in (float("nan"), float("inf"), -1.0):
        broken = weights.clone()
        broken[2, 3] = bad
        with pytest.raises(RuntimeError):
            sample(broken, 1)
    with pytest.raises(RuntimeError):
        sample(torch.zeros(3, 6), 1)  # a row of zero weights: torch refuses it
    assert len(calls) == 9
