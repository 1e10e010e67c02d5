"""The target kinds of the combined and indexed cache layers (lossless_check.laws.stateful): each crop they run.

Four layer kinds of 5.25.0's caches are rolled back by ``crop`` beside those of ``tests/test_stateful.py``: one layer
holding a linear-attention state and attention keys (``LinearAttentionAndFullAttentionLayer``, layer type
``hybrid``), the same with a sliding window (``LinearAttentionAndSlidingWindowAttentionLayer``, ``hybrid_sliding``),
and the sparse-attention layers with an indexer key cache (``DynamicIndexedLayer``, ``StaticIndexedLayer``,
``indexed_attention``). The negative controls: states left describing another history make the stub emit a law the
table never gives, and a crop that restores the wrong state or length, through the real loop, is ``not_lossless``
in generate and greedy mode while the release's own crop passes. The linear kinds need a release that verifies
drafts on stateful targets (5.25.0), whose own rollback is one recurrent state short
(findings/stateful_rollback_one_state_short): their release crop is judged with that finding's fix in place
(the cache records one state more, :class:`_KeepOneMore`), so the mutant is the only fault left.
"""

import pytest
import torch
from test_stateful import _cache, _case, _forward, _generate, _KeepOneMore, _replace_layer, _table_logits

from fixtures.releases import STATEFUL_TARGETS_REFUSED, STATIC_INDEXER_POSITIONS_KEPT, within
from lossless_check.laws.scenarios import STATEFUL
from lossless_check.laws.stateful import refusal, target_lm
from lossless_check.modes.greedy import run_greedy_case
from lossless_check.modes.loop_models import ASSISTED

REFUSED = within(STATEFUL_TARGETS_REFUSED)


def _history_and_cache(kind):
    scenario = STATEFUL[kind]
    model = target_lm(scenario)
    history = list(scenario.prompt) + [2]
    cache = _cache(model)
    _forward(model, cache, history, 0)
    return scenario, model, history, cache


def _recurrent_one_token_early(layer, model, history):
    early = _cache(model)
    _forward(model, early, history[:-1], 0)
    layer.recurrent_states[0] = early.layers[0].recurrent_states[0].clone()


def _keys_lost_one(layer, model, history):
    layer.keys, layer.values = layer.keys[:, :, :-1], layer.values[:, :, :-1]


def _indexer_kept_a_stale_key(layer, model, history):
    layer.indexer_keys = torch.cat([layer.indexer_keys, layer.indexer_keys[:, -1:]], dim=1)


def _indexer_count_one_long(layer, model, history):
    layer.indexer_cumulative_length.add_(1)


@pytest.mark.parametrize("kind, damage", [
    ("linear-full", _recurrent_one_token_early), ("linear-full", _keys_lost_one),
    ("linear-sliding", _recurrent_one_token_early), ("linear-sliding", None),
    ("indexed", _indexer_kept_a_stale_key), ("indexed", None),
    ("static-indexed", _indexer_count_one_long), ("static-indexed", None),
])
def test_a_layer_holding_another_history_changes_the_law(kind, damage):
    """The table's rows where every state describes the history (``None``: undamaged), each row mirrored where
    one of them (the recurrent state, the keys, the indexer keys or their count) describes another."""
    scenario, model, history, cache = _history_and_cache(kind)
    if damage is not None:
        damage(cache.layers[0], model, history)
    logits = _forward(model, cache, [5, 1], len(history))
    expected = _table_logits(scenario, history + [5, 1])[-2:]
    assert torch.equal(logits, expected if damage is None else expected.flip(-1))


class _CropsOnlyTheLinearState:
    """A combined layer whose crop rolls back the linear-attention state and leaves the keys (rejected drafts kept)."""

    def crop(self, tokens_to_remove):
        from transformers.cache_utils import LinearAttentionLayer

        LinearAttentionLayer.crop(self, tokens_to_remove)


class _KeepsTheIndexerKeys:
    """A dynamic indexed layer whose crop rolls back the keys and values but not the indexer keys."""

    def crop(self, tokens_to_remove):
        from transformers.cache_utils import DynamicLayer

        DynamicLayer.crop(self, tokens_to_remove)


class _OverCroppingIndexer:
    """A static indexed layer whose crop after a rejection takes one indexer key more than it is asked to (a crop
    that forgets the count altogether overflows the preallocated buffer: ``error``, not this law)."""

    def crop(self, tokens_to_remove):
        super().crop(tokens_to_remove)
        if tokens_to_remove < 0:
            self.indexer_cumulative_length.sub_(1)


class _CropsTheIndexerPositions:
    """A static indexed layer whose crop also rolls back the indexer's positions, as the dynamic one does
    (findings/static_indexer_positions_not_cropped's fix)."""

    def crop(self, tokens_to_remove):
        super().crop(tokens_to_remove)
        if tokens_to_remove and self.indexer_position_ids is not None:
            self.indexer_position_ids = self.indexer_position_ids[..., : -abs(tokens_to_remove)]


def _fixed_rollback(monkeypatch, layer_type):
    """The stateful rollback finding's fix in place: the combined layer records one recurrent state more."""
    _replace_layer(monkeypatch, layer_type, _KeepOneMore)


@pytest.mark.skipif(not within(STATIC_INDEXER_POSITIONS_KEPT), reason="the release's static indexed crop is not "
                    "the one of findings/static_indexer_positions_not_cropped")
def test_the_static_indexed_crop_of_this_release_keeps_the_rejected_drafts_positions(monkeypatch):
    """This release's ``StaticIndexedLayer.crop`` rolls back the keys and the indexer keys, not the positions the
    indexer keeps (findings/static_indexer_positions_not_cropped): after a rejection they name more tokens than
    the cache holds, a history Qwen4-exp's indexer reads its rotary positions from. Not lossless through the real
    loop in both modes; with the finding's fix, lossless."""
    assert _generate(ASSISTED, "static-indexed").verdict == "not_lossless"
    assert run_greedy_case(_case(ASSISTED, "static-indexed", "greedy")).verdict == "not_lossless"
    _replace_layer(monkeypatch, "indexed_attention", _CropsTheIndexerPositions, True)
    assert _generate(ASSISTED, "static-indexed").verdict == "lossless"
    assert run_greedy_case(_case(ASSISTED, "static-indexed", "greedy")).verdict == "lossless"


@pytest.mark.heavy
@pytest.mark.parametrize("kind, layer_type, mutant, static", [
    ("linear-full", "hybrid", _CropsOnlyTheLinearState, False),
    ("linear-sliding", "hybrid_sliding", _CropsOnlyTheLinearState, False),
    ("indexed", "indexed_attention", _KeepsTheIndexerKeys, False),
    ("static-indexed", "indexed_attention", _OverCroppingIndexer, True),
])
def test_a_crop_that_restores_the_wrong_state_is_caught_and_the_release_crop_passes(
        monkeypatch, kind, layer_type, mutant, static):
    """Through the real loop (assistant model, whose drafts never pass max_length): the release's crop is lossless
    in generate and greedy mode, a mutant of it that leaves a rejected draft in one of the layer's states is not."""
    if refusal(kind) is not None:
        pytest.skip(refusal(kind))
    if kind.startswith("linear"):
        _fixed_rollback(monkeypatch, layer_type)
    if kind == "static-indexed" and within(STATIC_INDEXER_POSITIONS_KEPT):
        _replace_layer(monkeypatch, layer_type, _CropsTheIndexerPositions, static)
    assert _generate(ASSISTED, kind).verdict == "lossless"
    assert run_greedy_case(_case(ASSISTED, kind, "greedy")).verdict == "lossless"
    _replace_layer(monkeypatch, layer_type, mutant, static)
    assert _generate(ASSISTED, kind).verdict == "not_lossless"
    assert run_greedy_case(_case(ASSISTED, kind, "greedy")).verdict == "not_lossless"


def test_the_combined_kinds_are_not_applicable_exactly_where_stateful_targets_are_refused():
    for kind in ("linear-full", "linear-sliding"):
        assert (refusal(kind) is not None) == REFUSED, refusal(kind)
    assert refusal("indexed") is None


def test_the_crop_only_kinds_take_the_smoke_stacks_in_generate_mode_and_the_first_four_the_whole_matrix():
    from lossless_check.faces.case_lists import stateful_cases
    from lossless_check.laws.matrix import matrix
    from lossless_check.laws.scenarios import CROP_ONLY_KINDS
    from lossless_check.subjects.adapters import resolve_generator

    generator = resolve_generator(ASSISTED)
    rows = stateful_cases([generator], matrix("default"))
    stacks = {kind: [c.warpers for c in rows if c.scenario.target_kind == kind] for kind in STATEFUL}
    for kind, taken in stacks.items():
        expected = [w for w in matrix("default") if kind not in CROP_ONLY_KINDS or w in matrix("smoke")]
        assert taken == expected or REFUSED, kind
    greedy = stateful_cases([generator], [{}], mode="greedy")
    assert {c.scenario.target_kind for c in greedy} == set(STATEFUL)
    # stacks of the run's own with none of the smoke matrix: the crop-only kinds take the first
    own = [{"top_p": 0.9}, {"min_p": 0.05}]
    assert [c.warpers for c in stateful_cases([generator], own) if c.scenario.target_kind == "indexed"] == own[:1]
