"""Batched drafting: one real ``get_candidates`` call on ``B`` identical rows, a fresh generator per call.

For every family flagged ``batchable`` on the installed release, a ``B``-row call must give ``B``
independent first-round drafts, each row what a batch-1 call drafting the same tokens returns:

- every sampled draft token is the token the sampler drew for its row, from
  ``softmax(returned candidate_logits)`` of that row and position (``torch.multinomial`` is
  recorded while the real call runs);
- replaying a row at batch 1 (the sampler forced to that row's tokens) returns the same
  ``candidate_ids`` and bitwise the same ``candidate_logits``; a row of a family whose drafts stop
  at EOS is compared after its cut at its first EOS draft token.

Every session call must build a fresh generator (the first drafting round of ``_assisted_decoding``),
never reuse one. Everything is checked on whatever release is installed (the tests run unchanged in
the virtual environments of older releases).
"""

from __future__ import annotations

import functools

import pytest
import torch

from lossless_check.adapters import ADAPTERS, DraftContext, FactoryAdapter, resolve_generator
from lossless_check.adapters.base import installed_release
from lossless_check.scenarios import DEFAULT, IID
from lossless_check.stubs import fixed_logits_lm
from lossless_check.warpers import capture_processors

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
    if name == "EarlyExitCandidateGenerator" and RELEASE < (5, 1):
        pytest.skip("EarlyExitCandidateGenerator of 5.0.x cannot run (README, Findings)")


class Multinomials:
    """Records every ``torch.multinomial`` call (its probability rows and tokens) while active.

    With ``force``, the i-th call returns ``force[i]`` (a batch-1 replay of given draft tokens);
    the original sampler still runs first, on the original arguments.
    """

    def __init__(self, force: list[int] | None = None):
        self.force = None if force is None else list(force)
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __enter__(self):
        self._original = original = torch.multinomial

        def multinomial(probs, num_samples, *args, **kwargs):
            out = original(probs, num_samples, *args, **kwargs)
            if self.force is not None:
                if len(self.calls) >= len(self.force):
                    raise AssertionError(f"more draws than the {len(self.force)} forced draft tokens")
                out = torch.full_like(out, self.force[len(self.calls)])
            self.calls.append((probs.detach().clone(), out.clone()))
            return out

        torch.multinomial = multinomial
        return self

    def __exit__(self, *exc):
        torch.multinomial = self._original


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


def check_batch_rows(name, scenario, warpers, batch=BATCH, seed=0, adapter=None):
    """The checks of the module docstring for one case; returns the rows' draft lengths."""
    adapter = adapter or ADAPTERS[name]
    ctx = context(name, scenario, warpers)
    session = adapter.session(ctx)
    prompt, length, vocab, gamma = ctx.prompt_ids, ctx.prompt_ids.shape[1], scenario.vocab_size, scenario.gamma
    torch.manual_seed(seed)
    with torch.no_grad(), Multinomials() as draws:
        ids, logits = session.draft(prompt.repeat(batch, 1))
    drafted = ids.shape[1] - length
    assert ids.shape[0] == batch and 1 <= drafted <= gamma, ids.shape
    assert logits is not None and tuple(logits.shape) == (batch, drafted, vocab), logits.shape
    assert torch.equal(ids[:, :length], prompt.expand(batch, -1))
    lengths = draft_lengths(adapter, ctx, ids)
    if not adapter.drafts_stop_at_eos:
        assert drafted == gamma

    if name in SAMPLING:
        # Each draft token is the one drawn for its row, from softmax of the logits returned for it.
        assert len(draws.calls) >= max(lengths), (len(draws.calls), lengths)
        for j in range(max(lengths)):
            probs, tokens = draws.calls[j]
            rows = torch.tensor([r for r in range(batch) if lengths[r] > j])
            assert probs.shape == (batch, vocab)
            assert torch.equal(tokens[rows, 0], ids[rows, length + j])
            torch.testing.assert_close(probs[rows], torch.softmax(logits[rows, j].float(), dim=-1), rtol=0, atol=1e-6)
    else:
        # Drafted by argmax: no sampler runs, and every row drafts the same tokens.
        assert not draws.calls
        assert torch.equal(ids, ids[:1].expand_as(ids)) and torch.equal(logits, logits[:1].expand_as(logits))

    # A batch-1 call drafting a row's tokens returns that row (cut at its first EOS), bitwise.
    for r in replay_rows(lengths, ids, length):
        n = lengths[r]
        force = ids[r, length : length + n].tolist() if name in SAMPLING else None
        with torch.no_grad(), Multinomials(force) as replayed:
            ids1, logits1 = session.draft(prompt)
        assert force is None or len(replayed.calls) == n
        assert torch.equal(ids1[0], ids[r, : length + n]), (ids1, ids[r], n)
        assert torch.equal(logits1[0], logits[r, :n])
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
@pytest.mark.parametrize("name", BATCHED)
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


def test_the_check_fails_for_a_batch_whose_rows_are_not_batch_1_calls():
    """Negative control: a batch whose rows get another row's q (history-dependent: rows differ) is caught."""
    runnable("DFlashTokenCandidateGenerator")
    from lossless_check.adapters.dflash import DFlashAdapter

    class RolledLogits(DFlashAdapter):
        def session(self, ctx):
            inner = super().session(ctx)

            def draft(input_ids):
                ids, logits = inner.draft(input_ids)
                return ids, logits.roll(1, dims=0)

            return type(inner)(draft)

    with pytest.raises(AssertionError):
        check_batch_rows("DFlashTokenCandidateGenerator", IID, {"repetition_penalty": 2.0}, adapter=RolledLogits())


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


@pytest.mark.parametrize("name", sorted(ADAPTERS))
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
